"""The distillation tests' student and teacher, made once per session (``distill_models.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from distill_models import exact_accuracy, fine_tune, val_reward

# AdamW steps of 32 answers each: enough for a student that answers the next digit on every
# validation prompt and a teacher that answers the asked one (both checked below).
STUDENT_STEPS, TEACHER_STEPS, LR = 60, 20, 5e-3


@dataclass(frozen=True)
class Model:
    path: Path
    exact: float  # greedy exact-answer accuracy on the validation prompts
    reward: float  # greedy task reward on them (val-core/polyrl/tiny_digits/reward/mean@1)


@pytest.fixture(scope="session")
def student(tmp_path_factory) -> Model:
    """``builtin:tiny`` taught to answer the next digit: reads the prompt, knows the format,
    never answers the asked digit."""
    path = fine_tune(
        "builtin:tiny",
        tmp_path_factory.mktemp("student") / "student",
        shift=1,
        steps=STUDENT_STEPS,
        lr=LR,
    )
    model = Model(path, exact_accuracy(path), val_reward(path))
    assert model.exact == 0.0 and model.reward == 0.5, model
    return model


@pytest.fixture(scope="session")
def teacher(student, tmp_path_factory) -> Model:
    """The student taught the asked digit."""
    path = fine_tune(
        student.path,
        tmp_path_factory.mktemp("teacher") / "teacher",
        shift=0,
        steps=TEACHER_STEPS,
        lr=LR,
    )
    model = Model(path, exact_accuracy(path), val_reward(path))
    assert model.exact > 0.9, model
    return model
