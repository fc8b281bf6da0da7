"""The distillation tests' teacher, made once per session (see ``distill_teacher.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from distill_teacher import greedy_val_reward, make_teacher

# Enough for a teacher that answers every validation prompt right, greedy (checked below).
TEACHER_STEPS, TEACHER_BATCH, TEACHER_LR = 30, 32, 1e-2


@pytest.fixture(scope="session")
def teacher(tmp_path_factory) -> tuple[Path, float]:
    """(the teacher's folder, its greedy validation reward)."""
    path = make_teacher(
        tmp_path_factory.mktemp("teacher") / "teacher",
        steps=TEACHER_STEPS,
        batch_size=TEACHER_BATCH,
        lr=TEACHER_LR,
    )
    reward = greedy_val_reward(path)
    assert reward > 0.9, f"the teacher itself reaches only {reward}"
    return path, reward
