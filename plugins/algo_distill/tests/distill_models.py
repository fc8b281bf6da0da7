"""The teacher of the distillation tests: ``builtin:tiny`` fine-tuned in plain torch on answers
of the tiny_digits task's training prompts, and its greedy validation reward.

Why a trained teacher rather than a random one: the student must move toward something it can
be checked against (the task's reward), and the teacher's own figure is what "most of the gap"
is measured against."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch

from polyrl.api import resolve_model_path
from polyrl.data.generate import tiny_digits_rows
from polyrl.rewards.scorers import tiny_digits_score

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
    """A training answer: the target digit repeated, or (one time in ``OTHER_DIGIT_SHARE``)
    another digit repeated, so the teacher keeps some mass on every digit, as a real teacher
    keeps mass on plausible alternatives. (A one-hot teacher ranks an immediate EOS above every
    wrong digit, and a student that cannot yet read the prompt then matches it best by stopping
    at once: the reverse KL is mode-seeking.)"""
    digit = target if rng.random() >= OTHER_DIGIT_SHARE else rng.choice("0123456789")
    return tokenizer.encode(digit * ANSWER_DIGITS, add_special_tokens=False)


def make_teacher(out_dir: Path, *, steps: int, batch_size: int, lr: float) -> Path:
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
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        model.train()
        for _ in range(steps):
            drawn = [rng.choice(prompts) for _ in range(batch_size)]
            batch = [
                (p, [*answer_ids(tokenizer, r["reward_model"]["ground_truth"], rng)])
                for p, r in drawn
            ]
            loss = answer_loss(model, batch, tokenizer.eos_token_id, tokenizer.pad_token_id)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def answer_loss(model, batch: list[tuple[list[int], list[int]]], eos: int, pad: int):
    """Cross-entropy of the answers (then EOS) after their prompts (right-padded rows)."""
    batch = [(prompt, [*answer, eos]) for prompt, answer in batch]
    width = max(len(p) + len(a) for p, a in batch)
    ids = torch.full((len(batch), width), pad)
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
    ``val-core/.../mean@1``), in one left-padded transformers ``generate`` call."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    rows = tiny_digits_rows(size=VAL_SIZE, seed=VAL_SEED, split="val")
    prompts = prompt_ids(tokenizer, rows)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )[:, width:]
    texts = tokenizer.batch_decode(out, skip_special_tokens=True)
    scores = [
        tiny_digits_score(text, row["reward_model"]["ground_truth"])["score"]
        for text, row in zip(texts, rows, strict=True)
    ]
    return sum(scores) / len(scores)
