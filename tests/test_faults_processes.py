"""Processes killed with ``kill -9`` (real processes, real signals, no mocks of the code under
test).

* The save path of the driver (``CheckpointManager`` as ``Trainer._save_checkpoint`` drives it)
  is SIGKILLed at each point of a save, from the empty staging folder to retention's deletion:
  what was complete before stays complete and verifies, ``resume_mode=auto`` picks the newest
  complete checkpoint (never the half-written one), the leftovers are cleaned at the next start.
* A real ``polyrl train recipe=tiny`` over Ray is SIGKILLed as a whole (its process group: the
  driver, Ray's GCS and raylet) while its workers write a checkpoint's shards; the next run
  resumes from the last complete checkpoint. There one Ray worker is SIGKILLed in the middle of a
  step: the run ends within a bounded time, exit status 2, one ``error:`` line naming the dead
  worker. The run after that resumes again and finishes with exit status 0. Checkpoints verify
  against the checksums of their commit markers and stay byte for byte what they were, and no
  file of the user's in the run folder is touched.

Each run is started in a session of its own; after it every process of it (Ray workers and
sandboxed scorers live in process groups of their own) must be gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from polyrl.checkpoint import CheckpointManager

pytestmark = pytest.mark.slow

TRAIN = [sys.executable, "-m", "polyrl", "train", "recipe=tiny", "trainer.test_freq=-1",
         "trainer.val_before_train=false", "trainer.export_hf_model=false",
         "trainer.save_freq=1"]  # fmt: skip
USER_FILES = {"notes.md": "my notes about this run\n", "my_eval/results.csv": "step,score\n1,0.5\n"}


class Run:
    """``polyrl train`` in a session of its own, its output in a file (a pipe could fill up)."""

    def __init__(self, out: Path, log: Path, *overrides: str) -> None:
        self.log = log
        with open(log, "w") as fh:
            self.proc = subprocess.Popen(
                [*TRAIN, f"trainer.default_local_dir={out}", *overrides],
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        self.driver = psutil.Process(self.proc.pid)
        self.seen: dict[int, psutil.Process] = {}

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def processes(self) -> list[psutil.Process]:
        """Every process of the run now: the driver's descendants (sandboxed scorers start
        sessions of their own) and everything in its session (Ray workers, whose parent is
        the raylet, have process groups of their own). Remembered for :meth:`leftovers`."""
        found = []
        with contextlib.suppress(psutil.Error):
            found = [self.driver, *self.driver.children(recursive=True)]
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getsid(proc.pid) == self.proc.pid:
                    found.append(proc)
        self.seen.update((p.pid, p) for p in found)
        return found

    def wait_for(
        self, what: str, found: Callable[[], object], timeout: float = 300, every_s: float = 0.02
    ) -> object:
        """Poll ``found`` every ``every_s`` until it returns something truthy (the run must be
        alive). Short windows (a save of the tiny model) need a few milliseconds; longer ones
        poll less, so that the waiting takes no CPU from the run it waits for."""
        deadline = time.monotonic() + timeout
        next_scan = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            result = found()
            if result:
                return result
            assert self.proc.poll() is None, (
                f"the run ended before {what}:\n{self.output()[-3000:]}"
            )
            if time.monotonic() > next_scan:
                self.processes()  # keep the list of the run's processes current
                next_scan = time.monotonic() + 1.0
            time.sleep(every_s)
        raise AssertionError(f"no {what} within {timeout} s:\n{self.output()[-3000:]}")

    def kill_9(self) -> None:
        """``kill -9`` of the run's process group, as an OOM killer or a scheduler does it."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.processes()  # those of other groups, still there (the scorers were seen before)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL

    def leftovers(self, timeout: float = 30) -> list[str]:
        """The run's processes still alive ``timeout`` s after the driver ended (then killed,
        so that a failing test leaves nothing behind)."""
        self.processes()
        deadline = time.monotonic() + timeout
        alive = [p for p in self.seen.values() if _alive(p)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if _alive(p)]
        described = []
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
                proc.kill()
        return described


def _alive(proc: psutil.Process) -> bool:
    """Running (a zombie waiting to be reaped has ended; ``is_running`` also tells a reused pid
    apart from the process seen)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    """The runs a test starts; any still going at its end are killed with all their processes."""
    started: list[Run] = []
    yield started
    for run in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait(timeout=30)
        run.leftovers(timeout=10)


# ---- what is in the run folder ------------------------------------------------------------
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def complete_steps(out: Path) -> list[int]:
    """The steps of the committed checkpoints (``global_step_<N>`` holding ``COMPLETE``)."""
    found = (re.fullmatch(r"global_step_(\d+)", p.name) for p in out.iterdir())
    return sorted(int(m.group(1)) for m in found if m and (out / m.group(0) / "COMPLETE").is_file())


def staging_folders(out: Path, step: int | None = None) -> list[Path]:
    number = str(step) if step is not None else r"\d+"
    pattern = rf"global_step_{number}\.tmp-\w+"
    return [p for p in out.iterdir() if re.fullmatch(pattern, p.name)]


def checkpoint_files(out: Path, step: int) -> dict[str, str]:
    """SHA-256 of every file of a committed checkpoint, after checking each against the
    checksums its commit marker recorded at save."""
    folder = out / f"global_step_{step}"
    recorded = json.loads((folder / "COMPLETE").read_text())["sha256"]
    files = {
        str(p.relative_to(folder)): _sha256(p)
        for p in folder.rglob("*")
        if p.is_file() and p.name != "COMPLETE"
    }
    assert files == recorded, f"global_step_{step} does not match the checksums of its save"
    return files


def write_user_files(out: Path) -> None:
    for name, text in USER_FILES.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)


def assert_user_files_intact(out: Path) -> None:
    for name, text in USER_FILES.items():
        assert (out / name).read_text() == text, f"{name} was changed or deleted"


def metric_steps(out: Path) -> list[int]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.strip()]


# ---- kill -9 at each point of a save (the driver's commit path) ----------------------------
# Saves steps 1..4 as Trainer._save_checkpoint does (staging folder, the workers' shards, the
# driver's state, commit), keeping 3 checkpoints; at ``point`` of step 4 it prints the point and
# waits to be killed. The points inside commit() are found by wrapping the filesystem calls it
# makes, which only pause: the code under test runs unchanged.
SAVE_DRIVER = """
import os, shutil, sys, time
sys.modules["torch"] = None  # RNG capture without torch: this process starts in a fraction of a s
from polyrl import checkpoint as ck

root, stop_at = sys.argv[1], sys.argv[2]
step = 0

def reached(point):
    if point == stop_at and step == 4:
        print(point, flush=True)
        time.sleep(600)

real_rename, real_write, real_rmtree = os.rename, ck.atomic_write_text, shutil.rmtree

def rename(src, dst):
    if ".tmp-" in str(src) and os.path.basename(str(dst)) == f"global_step_{step}":
        reached("marker written, before the rename")
    real_rename(src, dst)

def write(path, text):
    if os.path.basename(path) == ck.LATEST_FILE:
        reached("renamed, before the latest file")
    real_write(path, text)

def rmtree(path, *args, **kwargs):
    if ".del-" in os.path.basename(str(path)):
        reached("retention renamed the oldest aside, before deleting it")
    real_rmtree(path, *args, **kwargs)

os.rename, ck.atomic_write_text, shutil.rmtree = rename, write, rmtree
manager = ck.CheckpointManager(root, max_to_keep=3)
manager.clean_stale()
for step in range(1, 5):
    staging = manager.staging_dir(step)
    reached("staging folder made")
    os.makedirs(os.path.join(staging, "actor"))
    for rank in range(2):
        with open(os.path.join(staging, "actor", f"shard_{rank}.bin"), "wb") as fh:
            fh.write(os.urandom(1 << 20))
        reached(f"{rank + 1} of 2 shards written")
    ck.save_driver_state(staging, {"step": step})
    reached("driver state written")
    manager.commit(step, staging)
print("not killed", flush=True)
"""
# point -> the complete checkpoints after a kill -9 there, and what the kill leaves behind
SAVE_POINTS = {
    "staging folder made": ([1, 2, 3], "global_step_4.tmp-"),
    "1 of 2 shards written": ([1, 2, 3], "global_step_4.tmp-"),
    "driver state written": ([1, 2, 3], "global_step_4.tmp-"),
    "marker written, before the rename": ([1, 2, 3], "global_step_4.tmp-"),
    "renamed, before the latest file": ([1, 2, 3, 4], None),
    "retention renamed the oldest aside, before deleting it": ([2, 3, 4], "global_step_1.del-"),
}


def test_kill_9_at_each_point_of_a_save_keeps_every_complete_checkpoint(tmp_path: Path) -> None:
    for number, (point, (expected, leftover)) in enumerate(SAVE_POINTS.items()):
        root = tmp_path / f"point{number}"
        root.mkdir()
        write_user_files(root)
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVE_DRIVER, str(root), point], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            reached = proc.stdout.readline().strip()
            if reached == point:
                os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        assert reached == point, f"the save never reached '{point}': {reached!r} {stderr[-2000:]}"
        assert proc.returncode == -signal.SIGKILL

        assert complete_steps(root) == expected, point
        for step in expected:
            checkpoint_files(root, step)
        left = [p.name for p in root.iterdir() if re.fullmatch(r"global_step_\d+\.\w+-\w+", p.name)]
        assert len(left) == (1 if leftover else 0), left
        assert all(name.startswith(str(leftover)) for name in left), left
        latest = (root / "latest_checkpointed_iteration.txt").read_text().strip()
        assert latest == str(expected[-1] if point.startswith("retention") else 3), point

        # the next start: leftovers cleaned, auto picks the newest complete checkpoint
        manager = CheckpointManager(str(root), max_to_keep=3)
        manager.clean_stale()
        resumed = manager.resolve_resume({"resume_mode": "auto"})
        assert resumed == str(root / f"global_step_{expected[-1]}"), point
        assert complete_steps(root) == expected, point
        assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == str(expected[-1])
        assert sorted(p.name for p in root.iterdir() if p.name.startswith("global_step_")) == [
            f"global_step_{step}" for step in expected
        ], point
        assert_user_files_intact(root)


# ---- a real run: kill -9 mid-save, then a worker killed mid-step, then it finishes ---------
def busy_workers(run: Run) -> list[psutil.Process]:
    """The run's Ray worker processes that are running a call (Ray titles a busy actor
    ``ray::<Class>.<method>``, an idle one ``ray::<Class>``)."""
    workers = []
    for proc in run.processes():
        with contextlib.suppress(psutil.Error):
            title = proc.cmdline()[0] if proc.cmdline() else ""
            if title.startswith("ray::Worker."):
                workers.append(proc)
    return workers


def test_a_run_killed_mid_save_then_losing_a_worker_mid_step_resumes_each_time_and_finishes(
    tmp_path: Path, runs: list[Run]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    write_user_files(out)
    kept: dict[int, dict[str, str]] = {}  # step -> checksums of a complete checkpoint

    def check_checkpoints() -> list[int]:
        steps = complete_steps(out)
        for step in steps:
            files = checkpoint_files(out, step)
            assert kept.setdefault(step, files) == files, f"global_step_{step} was changed"
        assert set(kept) <= set(steps), f"checkpoints lost: {sorted(set(kept) - set(steps))}"
        assert_user_files_intact(out)
        return steps

    # 1. kill -9 of the whole run while its workers write the shards of step 2
    first = Run(out, tmp_path / "first.log", "trainer.total_training_steps=100")
    runs.append(first)
    first.wait_for("checkpoint 1", lambda: 1 in complete_steps(out))
    first.wait_for("the save of step 2", lambda: staging_folders(out, 2), every_s=0.002)
    first.kill_9()
    assert first.leftovers() == [], "processes left after kill -9 of the run"
    assert check_checkpoints() == [1]
    assert staging_folders(out, 2), "the kill did not hit the save of step 2"
    assert (out / "polyrl.lock").exists()  # a kill -9 cannot release it: the next run must

    # 2. auto resumes from checkpoint 1; a worker killed -9 during step 3 ends the run
    second = Run(out, tmp_path / "second.log", "trainer.total_training_steps=100")
    runs.append(second)
    second.wait_for("checkpoint 2", lambda: 2 in complete_steps(out) and not staging_folders(out))
    assert f"polyrl: resumed from {out / 'global_step_1'} (step 1)" in second.output()
    victim = second.wait_for("a worker running a step", lambda: busy_workers(second), 60)[0]
    victim.kill()
    killed_at = time.monotonic()
    code = second.proc.wait(timeout=120)
    elapsed = time.monotonic() - killed_at
    output = second.output()
    assert code == 2, output[-4000:]
    assert elapsed < 60, f"the run took {elapsed:.0f} s to end after its worker was killed"
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output[-4000:]
    log = out / "worker_errors.log"
    assert re.fullmatch(
        rf"error: worker rank [01] of pool 'global' failed in '[\w.]+': ActorDiedError: .*"
        rf" \(worker traceback in {re.escape(str(log))}\)",
        errors[0],
    ), errors[0]
    assert output.strip().splitlines()[-1] == errors[0]
    assert "Traceback" not in output
    assert f"pid: {victim.pid}" in log.read_text()  # the kept traceback names the dead process
    assert second.leftovers() == [], "processes left after the run ended"
    assert not (out / "polyrl.lock").exists()
    newest = check_checkpoints()[-1]
    assert newest >= 2

    # 3. auto resumes from the newest complete checkpoint and finishes: exit 0
    final = Run(out, tmp_path / "final.log", f"trainer.total_training_steps={newest + 1}")
    runs.append(final)
    assert final.proc.wait(timeout=300) == 0, final.output()[-4000:]
    assert f"polyrl: resumed from {out / f'global_step_{newest}'} (step {newest})" in final.output()
    assert final.leftovers() == []
    assert check_checkpoints() == list(range(1, newest + 2))
    assert staging_folders(out) == []  # the half-written save was cleaned up at a start
    assert (out / "latest_checkpointed_iteration.txt").read_text().strip() == str(newest + 1)
    assert not (out / "polyrl.lock").exists()
    assert metric_steps(out) == list(range(1, newest + 2))  # one record per step, none lost
