"""A full disk is named as such (issue 30.6): a real ``polyrl train`` whose run folder is on a
small, real filesystem (a tmpfs mounted for the test; skipped where mounting is not allowed)
stops with one line "no space left on device writing <what> to <where> (X free of Y ...)", exit
2, no traceback, and the log the line points to holds the details (in the run folder when it
could be written whole, else in the temporary folder). No fault is injected: the writes fail
because the disk is full (torch's checkpoint writer then says only "unexpected pos", which is
why a failed write on a disk left without room counts as a full disk).

Two runs: the checkpoint (about 5 MB, written by the Ray workers) does not fit on a 2 MiB disk
(the metrics of step 1 do); the metrics line of a step does not fit on a disk that the run lock
and the first page of metrics fill."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here

TRAIN = ["train", "recipe=tiny", *IN_PROCESS_OVERRIDES,
         "trainer.test_freq=-1",
         "trainer.val_before_train=false"]  # fmt: skip
LINE = re.compile(
    r"^error: no space left on device writing (?P<what>.+?) to (?P<where>\S+) "
    r"\((?P<free>.+? free of .+?) on that disk\): .*\(details in (?P<log>\S+)\)$"
)


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    size = request.param
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def train_into(folder: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``polyrl train`` with one worker, in this test process (``run_polyrl_here``)."""
    return run_polyrl_here(*TRAIN, f"trainer.default_local_dir={folder}", *overrides)


def full_disk_line(proc: subprocess.CompletedProcess) -> re.Match[str]:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    match = LINE.match(errors[0])
    assert match, errors[0]
    log = Path(match["log"])
    # the log holds the whole chain (the worker's error behind the line included)
    assert log.is_file() and "Traceback" in log.read_text(), errors[0]
    return match


@pytest.mark.parametrize("small_disk", ["2m"], indirect=True)
def test_a_checkpoint_that_does_not_fit_is_one_line(small_disk: Path) -> None:
    run = small_disk / "run"
    proc = train_into(run, "trainer.total_training_steps=2", "trainer.save_freq=1")
    match = full_disk_line(proc)
    assert match["what"] == "the checkpoint of step 1" and match["where"] == str(run)
    assert "MiB" in match["free"]
    assert not list(run.glob("global_step_*"))  # nothing half-written left as a checkpoint


@pytest.mark.parametrize("small_disk", ["12k"], indirect=True)
def test_metrics_that_do_not_fit_are_one_line(small_disk: Path) -> None:
    run = small_disk / "run"
    proc = train_into(run, "trainer.total_training_steps=20", "trainer.save_freq=-1")
    match = full_disk_line(proc)
    assert re.fullmatch(r"the metrics of step \d+", match["what"]), match["what"]
    assert match["where"] == str(run)
