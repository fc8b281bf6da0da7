"""Nothing polyrl did not write for this run is removed or replaced (no Ray, no torch):
a commit beside another run's or tool's step folder, an export beside a user's ``hf_model/``,
an earlier run's reward curve; and a resume refuses a setting its checkpoint would undo."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from polyrl.checkpoint import CheckpointManager, check_resume_changes, save_driver_state
from polyrl.errors import ConfigError
from polyrl.trainer.outputs import (
    EXPORT_RECORD,
    check_export_target,
    clean_export_leftovers,
    export_is_current,
    install_export,
    move_earlier_reward_curve_aside,
)


def tree(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def save(manager: CheckpointManager, step: int) -> str:
    staging = manager.staging_dir(step)
    os.makedirs(os.path.join(staging, "actor"))
    Path(staging, "actor", "shard.bin").write_bytes(os.urandom(64))
    save_driver_state(staging, {"step": step}, rng=False)
    return manager.commit(step, staging)


def test_a_commit_never_replaces_a_step_folder_of_another_run_or_tool(tmp_path: Path) -> None:
    tool = tmp_path / "global_step_2"  # another tool's layout: no marker
    (tool / "model").mkdir(parents=True)
    (tool / "model" / "weights.bin").write_bytes(b"theirs")
    other = CheckpointManager(str(tmp_path))
    save(other, 3)  # another polyrl run's complete checkpoint
    before = tree(tmp_path)

    mine = CheckpointManager(str(tmp_path))
    for step in (2, 3):
        with pytest.raises(ConfigError, match=rf"global_step_{step} was not written by this run"):
            save(mine, step)
    leftovers = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert len(leftovers) == 2  # the refused saves stay staging folders, never checkpoints
    mine.clean_stale()
    assert tree(tmp_path) == before
    assert save(mine, 4).endswith("global_step_4")  # its own steps are written as ever
    again = save(mine, 4)  # and its own checkpoint re-saved
    assert CheckpointManager(str(tmp_path)).latest() == (4, again)


def test_a_resume_refuses_a_setting_the_optimizer_state_would_put_back() -> None:
    saved = {"actor_rollout_ref": {"actor": {"optim": {"lr": 0.002}, "kl_loss_coef": 0.001}}}

    def current(lr: float, kl: float) -> dict:
        return {"actor_rollout_ref": {"actor": {"optim": {"lr": lr}, "kl_loss_coef": kl}}}

    with pytest.raises(ConfigError, match=r"optim\.lr: 0\.002 -> 50.*would not take effect"):
        check_resume_changes("ck", saved, current(50, 0.001), allow_changes=True)
    changes = check_resume_changes("ck", saved, current(0.002, 0.01), allow_changes=False)
    assert changes == ["actor_rollout_ref.actor.kl_loss_coef: 0.001 -> 0.01"]  # applied
    critic = {"critic": {"optim": {"weight_decay": 0.0}}}
    with pytest.raises(ConfigError, match=r"critic\.optim\.weight_decay: 0\.0 -> 0\.1"):
        check_resume_changes("ck", critic, {"critic": {"optim": {"weight_decay": 0.1}}}, True)
    model = {"actor_rollout_ref": {"model": {"path": "a"}}}
    with pytest.raises(ConfigError, match="define another run"):
        check_resume_changes("ck", model, {"actor_rollout_ref": {"model": {"path": "b"}}}, False)


def write_model(folder: str, content: bytes) -> None:
    Path(folder, "model.safetensors").write_bytes(content)


def test_an_export_lands_only_on_this_runs_own_export(tmp_path: Path) -> None:
    user = tmp_path / "hf_model"
    user.mkdir()
    (user / "model.safetensors").write_bytes(b"the user's model")
    before = tree(tmp_path)
    with pytest.raises(ConfigError, match=r"hf_model exists and was not exported by this run"):
        check_export_target(str(tmp_path), "run-a")
    with pytest.raises(ConfigError, match="not exported by this run"):
        install_export(str(tmp_path), "run-a", 5, lambda d: write_model(d, b"mine"))
    clean_export_leftovers(str(tmp_path))  # the refused export's staging folder
    assert tree(tmp_path) == before

    out = tmp_path / "run"
    out.mkdir()
    check_export_target(str(out), "run-a")  # nothing there: fine
    target = install_export(str(out), "run-a", 5, lambda d: write_model(d, b"step 5"))
    assert json.loads(Path(target, EXPORT_RECORD).read_text()) == {"run_id": "run-a", "step": 5}
    assert export_is_current(str(out), "run-a", 5)
    assert not export_is_current(str(out), "run-a", 6)
    assert not export_is_current(str(out), "run-b", 5)
    check_export_target(str(out), "run-a")  # its own export may be replaced
    install_export(str(out), "run-a", 6, lambda d: write_model(d, b"step 6"))
    assert Path(target, "model.safetensors").read_bytes() == b"step 6"
    assert sorted(p.name for p in out.iterdir()) == ["hf_model"]
    with pytest.raises(ConfigError):
        check_export_target(str(out), "run-b")  # another run's export is not replaced


def test_an_interrupted_export_leaves_one_complete_export(tmp_path: Path) -> None:
    # crashed between moving the old export aside and renaming the new one into place
    old = tmp_path / "hf_model.old-abc"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"old")
    (tmp_path / "hf_model.tmp-def").mkdir()
    clean_export_leftovers(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf_model"]
    assert (tmp_path / "hf_model" / "model.safetensors").read_bytes() == b"old"


def test_a_new_run_keeps_an_earlier_reward_curve(tmp_path: Path) -> None:
    (tmp_path / "reward_curve.png").write_bytes(b"earlier")
    move_earlier_reward_curve_aside(str(tmp_path))
    (tmp_path / "reward_curve.png").write_bytes(b"again")
    move_earlier_reward_curve_aside(str(tmp_path))
    kept = sorted(p.read_bytes() for p in tmp_path.glob("reward_curve.*.png"))
    assert kept == [b"again", b"earlier"]
    assert not (tmp_path / "reward_curve.png").exists()
