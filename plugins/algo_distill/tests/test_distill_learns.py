"""End to end: on-policy distillation learns. A teacher is made first (``builtin:tiny``
fine-tuned in plain torch on the tiny_digits task's correct answers), then ``polyrl train
algorithm.name=distill`` runs on 2 CPU workers over Ray with the randomly initialised tiny model
as the student and no task reward in its advantage: the student's greedy validation reward
must rise from before training toward the teacher's, and so must the reward of its samples.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch

from polyrl.data.generate import tiny_digits_rows
from polyrl.models.resolve import resolve_model_path
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID
from polyrl.rewards.scorers import tiny_digits_score
from polyrl.testing.cli import run_polyrl

pytestmark = pytest.mark.slow

VAL_REWARD = "val-core/polyrl/tiny_digits/reward/mean@1"
STEPS = 30
ANSWER_DIGITS = 8  # the teacher answers "dddddddd<|im_end|>": reward 1.0
OTHER_DIGIT_SHARE = 0.25
# builtin:tiny_digits writes train rows of seed 2 and 32 validation rows of seed 3.
TRAIN_SEED, VAL_SEED, VAL_SIZE = 2, 3, 32


def prompt_ids(tokenizer, rows: list[dict]) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        for row in rows
    ]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def answer_ids(tokenizer, target: str, rng: random.Random) -> list[int]:
    """A teacher's training answer: the target digit repeated, or (one time in
    ``OTHER_DIGIT_SHARE``) another digit repeated, so the teacher keeps some mass on every
    digit, as a real teacher keeps mass on plausible alternatives. (A one-hot teacher ranks an
    immediate EOS above every wrong digit, and a student that cannot yet read the prompt then
    matches it best by stopping at once: the reverse KL is mode-seeking.)"""
    digit = target if rng.random() >= OTHER_DIGIT_SHARE else rng.choice("0123456789")
    return tokenizer.encode(digit * ANSWER_DIGITS, add_special_tokens=False)


def make_teacher(out_dir: Path, *, steps: int = 120, batch_size: int = 32) -> Path:
    """``builtin:tiny`` fine-tuned by cross-entropy on answers of the training prompts (see
    :func:`answer_ids`, then EOS), saved with its tokenizer into ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(resolve_model_path("builtin:tiny"), out_dir)
    (out_dir / "polyrl_tiny.json").unlink(missing_ok=True)  # no longer the built-in's weights
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    rows = tiny_digits_rows(size=256, seed=TRAIN_SEED, split="train")
    prompts = list(zip(prompt_ids(tokenizer, rows), rows, strict=True))
    rng = random.Random(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        model.train()
        for _ in range(steps):
            drawn = [rng.choice(prompts) for _ in range(batch_size)]
            batch = [
                (p, [*answer_ids(tokenizer, r["reward_model"]["ground_truth"], rng), EOS_TOKEN_ID])
                for p, r in drawn
            ]
            loss = answer_loss(model, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def answer_loss(model, batch: list[tuple[list[int], list[int]]]) -> torch.Tensor:
    """Cross-entropy of the answers after their prompts (right-padded rows)."""
    width = max(len(p) + len(a) for p, a in batch)
    ids = torch.full((len(batch), width), PAD_TOKEN_ID)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (prompt, answer) in enumerate(batch):
        end = len(prompt) + len(answer)
        ids[i, :end] = torch.tensor([*prompt, *answer])
        mask[i, :end] = 1
        labels[i, len(prompt) : end] = ids[i, len(prompt) : end]
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


@torch.no_grad()
def greedy_val_reward(model_path: Path, max_new_tokens: int = 16) -> float:
    """The model's mean tiny_digits reward on the validation prompts, greedy (as polyrl's
    ``val-core/.../mean@1``), with transformers' generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    rows = tiny_digits_rows(size=VAL_SIZE, seed=VAL_SEED, split="val")
    scores = []
    for prompt, row in zip(prompt_ids(tokenizer, rows), rows, strict=True):
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=EOS_TOKEN_ID,
            pad_token_id=PAD_TOKEN_ID,
        )[0, len(prompt) :]
        text = tokenizer.decode(out, skip_special_tokens=True)
        scores.append(tiny_digits_score(text, row["reward_model"]["ground_truth"])["score"])
    return sum(scores) / len(scores)


def test_the_student_moves_toward_the_teacher(tmp_path: Path) -> None:
    teacher = make_teacher(tmp_path / "teacher")
    teacher_reward = greedy_val_reward(teacher)
    assert teacher_reward > 0.9, f"the teacher itself reaches only {teacher_reward}"

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = run_polyrl(
        env,
        "train",
        "recipe=tiny",
        "algorithm.name=distill",
        f"distill.teacher.model_path={teacher}",
        "distill.teacher.dtype=float32",
        "actor_rollout_ref.actor.use_kl_loss=false",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out}",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    before = next(r for r in records if r["step"] == 0)[VAL_REWARD]
    first, last = records[1], records[-1]
    after = last[VAL_REWARD]
    sampled = (first["critic/score/mean"], last["critic/score/mean"])
    print(
        f"\nteacher {teacher_reward:.3f}; student greedy before {before:.3f}, after {STEPS} "
        f"steps {after:.3f}; sampled score {sampled[0]:.3f} -> {sampled[1]:.3f}; reverse KL per "
        f"token {first['distill/reverse_kl/mean']:.3f} -> {last['distill/reverse_kl/mean']:.3f}",
        file=sys.stderr,
    )
    # the task reward is not in the advantage (task_reward_weight=0): only the teacher teaches
    assert after - before > 0.4 * (teacher_reward - before), (before, after, teacher_reward)
    assert sampled[1] > sampled[0] + 0.2, sampled


def test_the_teacher_runs_on_a_pool_of_its_own(tmp_path: Path) -> None:
    """``trainer.role_pools.teacher`` puts the teacher on its own worker; the step's first
    reverse KL is the colocated run's (same seeds, same samples: 0.872 in the README's run)."""
    teacher = make_teacher(tmp_path / "teacher", steps=120)
    out = tmp_path / "run"
    proc = run_polyrl(
        {**os.environ, "PYTHONUNBUFFERED": "1"},
        "train",
        "recipe=tiny",
        "algorithm.name=distill",
        f"distill.teacher.model_path={teacher}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "trainer.role_pools.teacher=teacher_pool",
        "trainer.resource_pools.teacher_pool=1",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out}",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["timing_s/teacher"] > 0
    assert record["distill/reverse_kl/mean"] == pytest.approx(0.872, abs=1e-3)
