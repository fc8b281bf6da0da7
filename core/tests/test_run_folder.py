"""The user's run folder is protected: one live run per folder, unreadable checkpoints are not
trained past, and retention deletes only this run's checkpoints."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from polyrl.checkpoint import LOCK_FILE, MARKER_FILE, CheckpointManager, RunLock
from polyrl.errors import ConfigError


def test_a_second_run_into_a_live_runs_folder_is_refused(tmp_path: Path) -> None:
    first = RunLock(str(tmp_path))
    first.acquire()
    with pytest.raises(ConfigError, match=rf"another polyrl run \(pid {os.getpid()} on host"):
        RunLock(str(tmp_path)).acquire()
    first.release()
    again = RunLock(str(tmp_path))
    again.acquire()  # free once released
    again.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_the_lock_of_a_process_that_is_gone_is_taken_over(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    record = {"pid": int(dead.stdout), "host": socket.gethostname(), "started_at": 0}
    (tmp_path / LOCK_FILE).write_text(json.dumps(record))
    lock = RunLock(str(tmp_path))
    lock.acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_lock_from_another_host_is_refused_with_how_to_clear_it(tmp_path: Path) -> None:
    record = {"pid": 1, "host": "elsewhere", "started_at": 0}
    (tmp_path / LOCK_FILE).write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"on host elsewhere.*delete .*polyrl\.lock"):
        RunLock(str(tmp_path)).acquire()


def _commit(mgr: CheckpointManager, step: int) -> str:
    staging = mgr.staging_dir(step)
    Path(staging, "trainer_state.json").write_text("{}")
    return mgr.commit(step, staging)


def test_auto_resume_refuses_a_folder_of_checkpoints_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "global_step_100" / "actor").mkdir(parents=True)  # e.g. verl's layout
    mgr = CheckpointManager(str(tmp_path))
    with pytest.raises(ConfigError, match=r"1 checkpoint folder\(s\) polyrl cannot resume from"):
        mgr.resolve_resume({"resume_mode": "auto"})
    with pytest.raises(ConfigError, match=r"resume_mode=disable: .*\(global_step_100\)"):
        mgr.resolve_resume({"resume_mode": "disable"})  # a new run beside them: refused too
    assert (tmp_path / "global_step_100" / "actor").is_dir()  # untouched


def test_retention_deletes_only_this_runs_checkpoints(tmp_path: Path) -> None:
    earlier = CheckpointManager(str(tmp_path))
    kept = [_commit(earlier, step) for step in (1, 2)]
    mine = CheckpointManager(str(tmp_path), max_to_keep=1)  # a new run, resume disabled
    for step in (10, 11, 12):
        _commit(mine, step)
    left = sorted(p.name for p in tmp_path.iterdir() if (p / MARKER_FILE).exists())
    assert left == ["global_step_1", "global_step_12", "global_step_2"]
    assert all(Path(p).is_dir() for p in kept)


def test_a_resumed_run_continues_the_retention_of_the_run_it_resumed(tmp_path: Path) -> None:
    first = CheckpointManager(str(tmp_path), max_to_keep=2)
    for step in (1, 2):
        _commit(first, step)
    resumed = CheckpointManager(str(tmp_path), max_to_keep=2)
    resumed.adopt_run(resumed.resolve_resume({"resume_mode": "auto"}))
    _commit(resumed, 3)
    left = sorted(p.name for p in tmp_path.iterdir() if (p / MARKER_FILE).exists())
    assert left == ["global_step_2", "global_step_3"]


def test_a_flipped_byte_is_named_and_auto_can_fall_back_to_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    mgr = CheckpointManager(str(tmp_path))
    older, newest = _commit(mgr, 1), _commit(mgr, 2)
    state = Path(newest, "trainer_state.json")
    state.write_bytes(b"[]" + state.read_bytes()[2:])  # same size, different bytes
    with pytest.raises(ConfigError, match=r"global_step_2: file trainer_state\.json is corrupt"):
        mgr.resolve_resume({"resume_mode": "auto"})
    picked = mgr.resolve_resume({"resume_mode": "auto", "resume_fallback": True})
    assert picked == older
    with pytest.raises(ConfigError, match="no older checkpoint is intact"):
        Path(older, "trainer_state.json").write_text("{} ")
        mgr.resolve_resume({"resume_mode": "auto", "resume_fallback": True})


def test_an_explicit_resume_path_is_verified_too(tmp_path: Path) -> None:
    mgr = CheckpointManager(str(tmp_path))
    path = _commit(mgr, 1)
    Path(path, "extra.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"file extra\.bin was added after the save"):
        mgr.resolve_resume({"resume_mode": "resume_path", "resume_from_path": path})


def test_config_changes_put_run_defining_ones_first_and_ignore_bookkeeping() -> None:
    from polyrl.checkpoint import config_changes

    saved = {
        "actor_rollout_ref": {"rollout": {"n": 4}, "actor": {"optim": {"lr": 1e-6}}},
        "trainer": {"total_training_steps": 10, "save_freq": 5},
    }
    current = {
        "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {"optim": {"lr": 2e-6}}},
        "trainer": {"total_training_steps": 20, "save_freq": 1},
    }
    assert config_changes(saved, current) == [
        "actor_rollout_ref.rollout.n: 4 -> 8 (run-defining)",
        "actor_rollout_ref.actor.optim.lr: 1e-06 -> 2e-06",
    ]
    assert config_changes(saved, saved) == []


def test_a_stop_that_outlasts_its_grace_exits_with_the_folder_unlocked(tmp_path: Path) -> None:
    """The stop deadline ends the process with ``os._exit`` (no ``finally`` runs): the run lock
    is released first, so the next run into the folder does not meet a held lock."""
    script = (
        "import time\n"
        "from polyrl import cli\n"
        "from polyrl.checkpoint import RunLock\n"
        f"RunLock({str(tmp_path)!r}).acquire()\n"
        "cli.STOP_GRACE_S = 0.5\n"
        "cli._arm_stop_deadline('SIGTERM', 143)\n"
        "time.sleep(60)  # a shutdown that never returns\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert ended.returncode == 143, ended.stderr
    assert ended.stderr.strip().startswith("polyrl: stopped by SIGTERM; shutting the workers")
    assert not (tmp_path / LOCK_FILE).exists()
