"""Ctrl-C and SIGTERM stop a run cleanly: one line, exit 130/143, no traceback, the run folder's
lock released, and the last complete checkpoint resumes. Over Ray (the driver waits on its
workers) and in one process (``IN_PROCESS_OVERRIDES``: the step runs in a worker thread while the
main thread takes the signal). The signalled run is a process of its own; the one-process run's
resume, which nothing signals, runs in the test's process (``run_polyrl_here``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here

pytestmark = pytest.mark.slow

TRAIN = ("train", "recipe=tiny", "trainer.test_freq=-1", "trainer.val_before_train=false",
         "trainer.save_freq=1")  # fmt: skip
RUN = [sys.executable, "-m", "polyrl", *TRAIN]


def _records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(("sig", "code", "name", "backend"), [
    (signal.SIGTERM, 143, "SIGTERM", ()),
    (signal.SIGINT, 130, "Ctrl-C", ()),
    (signal.SIGTERM, 143, "SIGTERM", IN_PROCESS_OVERRIDES),
], ids=["SIGTERM", "Ctrl-C", "SIGTERM-in-process"])  # fmt: skip
def test_a_signal_mid_run_stops_cleanly_and_the_run_resumes(
    sig: int, code: int, name: str, backend: tuple[str, ...], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*RUN, *backend, f"trainer.default_local_dir={out}", "trainer.total_training_steps=500"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    deadline = time.monotonic() + 400
    while len(_records(out)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith(f"polyrl: stopped by {name};")
    assert "Traceback" not in stderr
    assert not (out / "polyrl.lock").exists()
    done_steps = len(_records(out))
    if sig != signal.SIGTERM:
        return
    resume = (*backend, f"trainer.default_local_dir={out}",
              f"trainer.total_training_steps={done_steps + 1}")  # fmt: skip
    if backend:
        again = run_polyrl_here(*TRAIN, *resume)
    else:  # over Ray: workers start from this process, so a fresh interpreter
        again = subprocess.run(
            [*RUN, *resume], capture_output=True, text=True, timeout=600, env={**os.environ},
            check=False,
        )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr
