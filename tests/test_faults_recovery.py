"""Automatic recovery (``trainer.max_restarts``) with a real Ray worker process killed -9 in the
middle of a ``recipe=tiny`` run: the controller replaces the workers, goes back to the newest
complete checkpoint and finishes with exit status 0; the restart is in the metrics and in
``restarts.jsonl``; every prompt is trained once per epoch (by the dataset index the step's
batch carries, recorded by a spy around the trainer's step), and the steps trained again after
the restart trained the same prompts as the first time.

The runs join this session's shared Ray cluster (tests/conftest.py), as a user's runs join a
cluster: their workers are that cluster's processes, found in its session.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

PROMPTS = 32  # builtin:tiny_digits?train_size=32 in batches of 8: 4 steps per epoch
STEPS_PER_EPOCH = PROMPTS // 8
STEPS = 3 * STEPS_PER_EPOCH

# polyrl.train in a script, with a spy that records the dataset indices each finished step
# trained on (it calls the trainer's step unchanged).
SCRIPT = """
import json, sys

import polyrl
from polyrl.trainer import trainer

record, real_step = open(sys.argv[2], "a"), trainer.RLTrainer._run_step


def recorded_step(self, step):
    state = real_step(self, step)
    indices = sorted({int(i) for i in state.batch["index"]})
    record.write(json.dumps({"step": step, "index": indices}) + "\\n")
    record.flush()
    return state


trainer.RLTrainer._run_step = recorded_step
polyrl.train(["recipe=tiny", f"trainer.default_local_dir={sys.argv[1]}", *sys.argv[3:]])
"""


def _ray_sessions() -> set[int]:
    """The sessions of the Ray nodes this test process started (the shared cluster's head runs
    in a session of its own, tests/ray_nodes.py): its worker processes are in them."""
    sessions = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error, OSError):
            sessions.add(os.getsid(child.pid))
    return sessions - {os.getsid(0)}


def _busy_workers(sessions: set[int], call: str = "") -> list[psutil.Process]:
    """The Ray worker processes in ``sessions`` (the cluster the run joined, or the run's own)
    that are running a call (``call``: that one, e.g. ``__init__``)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            # the session first: one system call, where reading every process's command line
            # (a file each) at each poll took CPU from the run under test
            if os.getsid(proc.pid) not in sessions:
                continue
            title = proc.cmdline()[:1]
            if title and title[0].startswith(f"ray::Worker.{call}"):
                found.append(proc)
    return found


def _launch(tmp_path: Path, overrides: list[str]) -> tuple[subprocess.Popen, Path, Path, Path]:
    """The training script in its own session: the process, its run folder, step record, log."""
    out, steps_file, log = tmp_path / "run", tmp_path / "steps.jsonl", tmp_path / "run.log"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(out), str(steps_file), *overrides],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    return proc, out, steps_file, log


def _kill_one_then_wait(
    proc: subprocess.Popen, log: Path, pick: Callable[[], list[psutil.Process]], within_s: float
) -> int:
    """Kill -9 the first process ``pick`` finds (polling while the run lives), then wait for the
    run; its exit status. The run's whole session is killed on the way out."""
    try:
        deadline = time.monotonic() + within_s
        victim = None
        while victim is None and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-4000:]
            found = pick()
            victim = found[0] if found else None
            time.sleep(0.01)  # a step and a worker's start take seconds
        assert victim is not None, f"no worker to kill:\n{log.read_text()[-3000:]}"
        victim.kill()
        return proc.wait(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _metric_records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_killed_worker_is_replaced_and_the_run_trains_every_prompt_once_per_epoch(
    tmp_path: Path,
) -> None:
    overrides = [
        f'data.train_files="builtin:tiny_digits?train_size={PROMPTS}"',
        f"trainer.total_training_steps={STEPS}", "trainer.save_freq=2", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.export_hf_model=false",
        "trainer.max_restarts=2",
    ]  # fmt: skip
    proc, out, steps_file, log = _launch(tmp_path, overrides)
    sessions = {proc.pid, *_ray_sessions()}
    code = _kill_one_then_wait(
        proc,
        log,
        lambda: _busy_workers(sessions) if len(_metric_records(out)) >= 3 else [],
        within_s=240,
    )
    output = log.read_text()
    assert code == 0, output[-6000:]

    restarts = [json.loads(line) for line in (out / "restarts.jsonl").read_text().splitlines()]
    assert len(restarts) == 1, restarts
    restart = restarts[0]
    assert restart["resumed_step"] % 2 == 0 and restart["resumed_step"] >= 2, restart
    assert restart["steps_lost"] == restart["finished_steps"] - restart["resumed_step"]
    assert "polyrl: restart 1 of at most 2 after a worker was lost" in output

    records = _metric_records(out)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # every step exactly once
    marked = [r for r in records if "recovery/restarts" in r]
    assert len(marked) == 1 and marked[0]["step"] == restart["resumed_step"] + 1, marked
    assert marked[0]["recovery/steps_lost"] == restart["steps_lost"]

    trained: dict[int, list[list[int]]] = collections.defaultdict(list)
    for line in steps_file.read_text().splitlines():
        entry = json.loads(line)
        trained[entry["step"]].append(entry["index"])
    assert sorted(trained) == list(range(1, STEPS + 1))
    for step, runs in trained.items():  # a step trained again trained the same prompts
        assert all(indices == runs[0] for indices in runs), (step, runs)
    redone = [step for step, runs in trained.items() if len(runs) > 1]
    # the steps lost, and the step that was running when its training had finished (the
    # worker was killed while it was logged or saved)
    assert len(redone) - restart["steps_lost"] in (0, 1), (redone, restart)
    for epoch in range(STEPS // STEPS_PER_EPOCH):
        steps = range(epoch * STEPS_PER_EPOCH + 1, (epoch + 1) * STEPS_PER_EPOCH + 1)
        indices = [i for step in steps for i in trained[step][-1]]
        assert sorted(indices) == list(range(PROMPTS)), f"epoch {epoch}: {sorted(indices)}"


def test_a_worker_killed_while_the_workers_start_is_replaced_before_the_first_step(
    tmp_path: Path,
) -> None:
    overrides = [
        "trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.export_hf_model=false",
        "trainer.max_restarts=1",
    ]  # fmt: skip
    proc, out, _, log = _launch(tmp_path, overrides)
    sessions = {proc.pid, *_ray_sessions()}
    code = _kill_one_then_wait(proc, log, lambda: _busy_workers(sessions, "__init__"), within_s=120)
    output = log.read_text()
    assert code == 0, output[-6000:]
    assert "lost while the workers started; starting them again" in output, output[-4000:]
    restarts = [json.loads(line) for line in (out / "restarts.jsonl").read_text().splitlines()]
    assert [(r["number"], r["failed_step"], r["steps_lost"]) for r in restarts] == [(1, 0, 0)]
    records = _metric_records(out)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["recovery/restarts"] == 1.0 and records[0]["recovery/steps_lost"] == 0.0
