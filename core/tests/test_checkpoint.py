"""CheckpointManager on a real filesystem: commits, crash leftovers, retention, resume modes,
and the driver's state and RNG round trip."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

from polyrl.checkpoint import (
    LATEST_FILE,
    MARKER_FILE,
    TRAINER_STATE_FILE,
    CheckpointManager,
    config_hash,
    load_driver_state,
    read_latest_file,
    save_driver_state,
    step_of,
)
from polyrl.errors import ConfigError

torch.set_num_threads(1)


def _save(mgr: CheckpointManager, step: int, payload: str = "weights") -> str:
    """What the trainer does: workers write actor/, the driver its state, then commit."""
    staging = mgr.staging_dir(step)
    os.makedirs(os.path.join(staging, "actor"))
    with open(os.path.join(staging, "actor", "shard_0.bin"), "w") as fh:
        fh.write(payload)
    save_driver_state(staging, {"step": step, "epoch": 0})
    return mgr.commit(step, staging)


def _read_payload(path: str) -> str:
    with open(os.path.join(path, "actor", "shard_0.bin")) as fh:
        return fh.read()


def test_commit_lays_out_verl_folders_and_latest_file(tmp_path):
    mgr = CheckpointManager(str(tmp_path / "ckpt"))
    assert mgr.latest() is None
    path = _save(mgr, 5)
    assert path == str(tmp_path / "ckpt" / "global_step_5")
    assert sorted(os.listdir(path)) == sorted(
        ["actor", MARKER_FILE, TRAINER_STATE_FILE, "driver_rng.json"]
    )
    assert mgr.latest() == (5, path)
    with open(tmp_path / "ckpt" / LATEST_FILE) as fh:
        assert fh.read() == "5"
    _save(mgr, 10)
    assert mgr.latest()[0] == 10 and read_latest_file(mgr.root_dir) == 10
    # nothing but the two checkpoints and the tracker file: no temp files left
    assert sorted(os.listdir(mgr.root_dir)) == sorted(
        [LATEST_FILE, "global_step_10", "global_step_5"]
    )
    assert step_of(path) == 5 and step_of(str(tmp_path)) is None


def test_crash_leftovers_are_ignored_then_cleaned(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    _save(mgr, 2)
    # crash 1: workers were writing step 4 when the job died (staging, no marker)
    crashed = mgr.staging_dir(4)
    os.makedirs(os.path.join(crashed, "actor"))
    # crash 2: a folder with the final name but no marker (e.g. copied by hand, half-written)
    os.makedirs(tmp_path / "global_step_6" / "actor")
    # crash 3: a staging folder that got its marker but died before the rename
    staged = mgr.staging_dir(8)
    with open(os.path.join(staged, MARKER_FILE), "w") as fh:
        fh.write("{}")
    assert mgr.latest() == (2, str(tmp_path / "global_step_2"))
    assert mgr.resolve_resume({"resume_mode": "auto"}) == str(tmp_path / "global_step_2")

    removed = mgr.clean_stale()
    assert sorted(removed) == sorted([crashed, staged])
    assert sorted(os.listdir(tmp_path)) == sorted([LATEST_FILE, "global_step_2", "global_step_6"])
    assert mgr.latest()[0] == 2  # the markerless global_step_6 still does not count


def test_resave_of_a_step_replaces_it_and_a_crash_midway_is_repaired(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    _save(mgr, 3, payload="first")
    path = _save(mgr, 3, payload="second")
    assert _read_payload(path) == "second"
    assert sorted(os.listdir(tmp_path)) == sorted([LATEST_FILE, "global_step_3"])

    # crash between "move old copy aside" and "rename staging into place"
    os.rename(path, str(tmp_path / "global_step_3.old-abc123"))
    leftover = mgr.staging_dir(3)
    assert mgr.latest() is None  # nothing half-done is picked up
    mgr.clean_stale()
    assert mgr.latest() == (3, path) and _read_payload(path) == "second"
    assert not os.path.exists(leftover)


def test_retention_keeps_newest_and_never_the_just_written(tmp_path):
    mgr = CheckpointManager(str(tmp_path), max_to_keep=2)
    for step in (1, 2, 3, 4):
        _save(mgr, step)
    assert [s for s, _ in mgr.complete_checkpoints()] == [3, 4]
    # re-saving an older step (e.g. after resuming from it) keeps the one just written
    _save(mgr, 1)
    assert [s for s, _ in mgr.complete_checkpoints()] == [1, 4]
    assert not any(".del-" in n or ".tmp-" in n for n in os.listdir(tmp_path))
    keep_all = CheckpointManager(str(tmp_path), max_to_keep=None)
    _save(keep_all, 9)
    _save(keep_all, 10)
    assert [s for s, _ in keep_all.complete_checkpoints()] == [1, 4, 9, 10]
    with pytest.raises(ConfigError, match="max_actor_ckpt_to_keep"):
        CheckpointManager(str(tmp_path), max_to_keep="2")


def test_resume_modes(tmp_path):
    mgr = CheckpointManager(str(tmp_path / "run"))
    assert mgr.resolve_resume({"resume_mode": "auto"}) is None  # fresh start
    first, second = _save(mgr, 1), _save(mgr, 2)
    assert mgr.resolve_resume({"resume_mode": "auto", "resume_from_path": None}) == second
    assert (
        CheckpointManager(str(tmp_path / "new")).resolve_resume({"resume_mode": "disable"}) is None
    )
    with pytest.raises(
        ConfigError, match=r"resume_mode=disable: .*\(global_step_1, global_step_2\)"
    ):
        mgr.resolve_resume({"resume_mode": "disable"})  # beside another run's checkpoints
    picked = mgr.resolve_resume({"resume_mode": "resume_path", "resume_from_path": first})
    assert picked == first

    with pytest.raises(ConfigError, match=r"needs trainer\.resume_from_path"):
        mgr.resolve_resume({"resume_mode": "resume_path"})
    with pytest.raises(ConfigError, match="no such folder"):
        mgr.resolve_resume(
            {"resume_mode": "resume_path", "resume_from_path": str(tmp_path / "nope")}
        )
    with pytest.raises(ConfigError, match="global_step_<N>"):
        mgr.resolve_resume({"resume_mode": "resume_path", "resume_from_path": str(tmp_path)})
    os.remove(os.path.join(first, MARKER_FILE))
    with pytest.raises(ConfigError, match=r"incomplete checkpoint.*newest complete one.*step_2"):
        mgr.resolve_resume({"resume_mode": "resume_path", "resume_from_path": first})
    with pytest.raises(ConfigError, match="auto, disable, resume_path"):
        mgr.resolve_resume({"resume_mode": "latest"})


def test_commit_refuses_a_folder_it_did_not_stage(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    staging = mgr.staging_dir(3)
    with pytest.raises(ValueError, match="staging_dir"):
        mgr.commit(4, staging)  # wrong step
    with pytest.raises(ValueError, match="staging_dir"):
        mgr.commit(3, str(tmp_path.parent))
    with pytest.raises(ValueError, match="non-negative"):
        mgr.staging_dir(-1)


def test_latest_file_is_replaced_atomically(tmp_path, monkeypatch):
    mgr = CheckpointManager(str(tmp_path))
    _save(mgr, 1)
    # a crash while writing the tracker: os.replace never happens -> old content intact
    import polyrl.checkpoint as ck

    def boom(src, dst):
        raise OSError("killed")

    monkeypatch.setattr(ck.os, "replace", boom)
    staging = mgr.staging_dir(2)
    with pytest.raises(OSError, match="killed"):
        mgr.commit(2, staging)
    monkeypatch.undo()
    assert read_latest_file(str(tmp_path)) == 1
    assert not [n for n in os.listdir(tmp_path) if n.startswith(f".{LATEST_FILE}")]
    # the checkpoint itself was renamed before the tracker update, so it is complete and counts;
    # clean_stale brings the tracker in line
    assert mgr.latest()[0] == 2
    mgr.clean_stale()
    assert read_latest_file(str(tmp_path)) == 2


def test_driver_state_and_rng_round_trip(tmp_path):
    state = {"step": 7, "epoch": 1, "dataloader": {"index": 42}, "config_hash": config_hash({})}
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    save_driver_state(str(tmp_path), state)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    # advance every generator, then restore
    random.random(), np.random.rand(), torch.rand(3)
    loaded = load_driver_state(str(tmp_path))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert loaded == {**state, "polyrl_version": "0.1.0"}
    with open(tmp_path / TRAINER_STATE_FILE) as fh:
        assert json.load(fh)["dataloader"] == {"index": 42}


def test_driver_state_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"no trainer_state\.json"):
        load_driver_state(str(tmp_path))
    with pytest.raises(TypeError, match="JSON-serialisable"):
        save_driver_state(str(tmp_path), {"step": torch.tensor(1)})
    (tmp_path / TRAINER_STATE_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="corrupt"):
        load_driver_state(str(tmp_path))


def test_config_hash_ignores_key_order():
    a = config_hash({"trainer": {"seed": 1, "logger": ["console"]}, "data": {}})
    b = config_hash({"data": {}, "trainer": {"logger": ["console"], "seed": 1}})
    assert a == b and len(a) == 64
    assert a != config_hash({"trainer": {"seed": 2, "logger": ["console"]}, "data": {}})
