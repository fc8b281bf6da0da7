"""End to end: ``polyrl train recipe=distill_tiny`` learns. The teacher (``builtin:tiny``
fine-tuned in plain torch on the tiny_digits task's answers, once per session: see
``distill_teacher.py``) is given to the recipe; the randomly initialised tiny student runs on 2
CPU workers over Ray with no task reward in its advantage: its greedy validation reward must
close most of the gap to the teacher's, and the reward of its samples must rise. The teacher on
a pool of its own must score the same samples the same.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from polyrl.testing.cli import run_polyrl

pytestmark = pytest.mark.slow

VAL_REWARD = "val-core/polyrl/tiny_digits/reward/mean@1"


def distill(teacher: Path, out: Path, *overrides: str) -> list[dict]:
    """``polyrl train recipe=distill_tiny`` with ``teacher``; its metrics, step by step."""
    proc = run_polyrl(
        {**os.environ, "PYTHONUNBUFFERED": "1"},
        "train",
        "recipe=distill_tiny",
        f"distill.teacher.model_path={teacher}",
        *overrides,
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out}",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def recipe_run(teacher, tmp_path_factory) -> list[dict]:
    """The recipe as it is: the teacher in the actor's pool."""
    return distill(teacher[0], tmp_path_factory.mktemp("distill") / "run")


def test_the_student_closes_most_of_the_gap(recipe_run, teacher) -> None:
    records, teacher_reward = recipe_run, teacher[1]
    before = next(r for r in records if r["step"] == 0)[VAL_REWARD]
    first, last = records[1], records[-1]
    after = last[VAL_REWARD]
    sampled = (first["critic/score/mean"], last["critic/score/mean"])
    print(
        f"\nteacher {teacher_reward:.3f}; student greedy before {before:.3f}, after "
        f"{last['step']} steps {after:.3f}; sampled score {sampled[0]:.3f} -> {sampled[1]:.3f}; "
        f"reverse KL per token {first['distill/reverse_kl/mean']:.3f} -> "
        f"{last['distill/reverse_kl/mean']:.3f}",
        file=sys.stderr,
    )
    # the task reward is not in the advantage (task_reward_weight=0): only the teacher teaches
    assert after - before > 0.5 * (teacher_reward - before), (before, after, teacher_reward)
    assert sampled[1] > 2 * sampled[0], sampled


def test_the_teacher_runs_on_a_pool_of_its_own(recipe_run, teacher, tmp_path) -> None:
    """``trainer.role_pools.teacher`` puts the teacher on a worker of its own: the first step's
    reverse KL is the colocated run's (same seeds, same samples)."""
    (record,) = distill(
        teacher[0],
        tmp_path / "run",
        "trainer.role_pools.teacher=teacher_pool",
        "trainer.resource_pools.teacher_pool=1",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
    )
    assert record["timing_s/teacher"] > 0
    colocated = next(r for r in recipe_run if r["step"] == 1)
    assert record["distill/reverse_kl/mean"] == pytest.approx(
        colocated["distill/reverse_kl/mean"], abs=1e-5
    )
