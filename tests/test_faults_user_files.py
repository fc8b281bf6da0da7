"""What a user keeps in a run folder survives polyrl, byte for byte (real ``polyrl train``):
a new run (``resume_mode=disable``) beside another tool's step folder and a run beside a user's
``hf_model/`` are refused in one line before Ray starts; a resume that would announce a
learning rate its checkpoint's optimizer state then undoes is refused in one line too."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here

TRAIN = ["train", "recipe=tiny", *IN_PROCESS_OVERRIDES,
         "trainer.test_freq=-1",
         "trainer.val_before_train=false"]  # fmt: skip


def tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def train(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``polyrl train`` with one worker, in this test process (``run_polyrl_here``)."""
    return run_polyrl_here(*TRAIN, f"trainer.default_local_dir={out}", *overrides)


def refused(proc: subprocess.CompletedProcess, pattern: str) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert pattern in errors[0], errors[0]
    assert "Traceback" not in proc.stderr and "Started a local Ray" not in proc.stderr
    return errors[0]


def test_a_users_step_folder_and_hf_model_are_left_byte_identical(tmp_path: Path) -> None:
    beside_steps = tmp_path / "steps"
    (beside_steps / "global_step_1" / "actor").mkdir(parents=True)  # another tool's checkpoint
    (beside_steps / "global_step_1" / "actor" / "model.pt").write_bytes(os.urandom(256))
    before = tree(beside_steps)
    proc = train(beside_steps, "trainer.resume_mode=disable", "trainer.total_training_steps=1")
    refused(proc, "resume_mode=disable")
    assert tree(beside_steps) == before

    beside_model = tmp_path / "model"
    (beside_model / "hf_model").mkdir(parents=True)
    (beside_model / "hf_model" / "config.json").write_text('{"mine": true}\n')
    (beside_model / "hf_model" / "model.safetensors").write_bytes(os.urandom(256))
    before = tree(beside_model)
    proc = train(beside_model, "trainer.total_training_steps=1")
    refused(proc, "hf_model exists and was not exported by this run")
    assert tree(beside_model) == before


def test_a_resume_with_another_learning_rate_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = train(out, "trainer.total_training_steps=1", "trainer.save_freq=1")
    assert first.returncode == 0, first.stderr[-3000:]
    before = tree(out)
    proc = train(out, "trainer.total_training_steps=2", "actor_rollout_ref.actor.optim.lr=50")
    refused(proc, "actor_rollout_ref.actor.optim.lr: 0.002 -> 50")
    assert tree(out) == before
