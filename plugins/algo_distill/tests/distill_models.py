"""The models of the distillation tests, both ``builtin:tiny`` fine-tuned in plain torch on
answers to the tiny_digits task's training prompts, and how their greedy answers are scored.

- The **student** answers the *next* digit (``3`` -> ``44444444``): it reads the prompt and
  answers in the task's format, but never the asked digit. A randomly initialised 2-layer
  student does not learn to read the prompt from on-policy samples within a test's budget
  (see the README), so without this start the test would measure the answer format only.
- The **teacher** is the student fine-tuned further on the asked digit (``3`` -> ``33333333``).

Each answer character is the answer digit, or (one time in ``NOISE``) a random digit, so a
model keeps some mass on every digit, as a real teacher keeps mass on plausible alternatives:
a one-hot teacher gives the student nothing to prefer among wrong digits, and the reverse KL
is mode-seeking. The answers have no EOS: both models write digits up to the recipe's
``data.max_response_length`` (8), so a teacher that cannot count to 8 does not rank an early
EOS above a wrong digit (a student then learns to stop at once).

``exact_accuracy`` is the metric the answer format cannot pass: the share of validation prompts
whose greedy answer is the asked digit and nothing else (a digit answer that is wrong scores 0
here, but 0.5 on the task's reward).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch

from polyrl.api import resolve_model_path
from polyrl.data.generate import tiny_digits_rows
from polyrl.rewards.scorers import tiny_digits_score

ANSWER_DIGITS = 8  # = recipe=distill_tiny's data.max_response_length
NOISE = 0.25  # share of answer characters drawn at random
# builtin:tiny_digits writes train rows of seed 2 and 32 validation rows of seed 3.
TRAIN_SEED, VAL_SEED, VAL_SIZE = 2, 3, 32


def prompt_ids(tokenizer, rows: list[dict]) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        for row in rows
    ]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def answer_text(digit: int, rng: random.Random) -> str:
    """``ANSWER_DIGITS`` characters, each ``digit`` or (one time in ``NOISE``) a random one."""
    return "".join(
        str(digit) if rng.random() >= NOISE else rng.choice("0123456789")
        for _ in range(ANSWER_DIGITS)
    )


def fine_tune(
    base: str | Path, out_dir: Path, *, shift: int, steps: int, lr: float, batch_size: int = 32
) -> Path:
    """``base`` fine-tuned by cross-entropy on answers ``(asked digit + shift) % 10`` (see
    :func:`answer_text`) to the training prompts, saved with its tokenizer into ``out_dir``.
    One torch thread: on the shared 2-core test machine two threads ran 7x slower."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(resolve_model_path(str(base)), out_dir)
    (out_dir / "polyrl_tiny.json").unlink(missing_ok=True)  # no longer the built-in's weights
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    rows = tiny_digits_rows(size=256, seed=TRAIN_SEED, split="train")
    prompts = list(zip(prompt_ids(tokenizer, rows), rows, strict=True))
    rng = random.Random(shift)
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        torch.set_num_threads(1)
        try:
            model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
            model.train()
            for _ in range(steps):
                batch = []
                for prompt, row in (rng.choice(prompts) for _ in range(batch_size)):
                    digit = (int(row["reward_model"]["ground_truth"]) + shift) % 10
                    answer = tokenizer.encode(answer_text(digit, rng), add_special_tokens=False)
                    batch.append((prompt, answer))
                loss = answer_loss(model, batch, tokenizer.pad_token_id)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            model.save_pretrained(out_dir, safe_serialization=True)
        finally:
            torch.set_num_threads(threads)
    return out_dir


def answer_loss(model, batch: list[tuple[list[int], list[int]]], pad: int):
    """Cross-entropy of the answers after their prompts (right-padded rows)."""
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
def greedy_answers(model_path: Path) -> list[tuple[str, str]]:
    """``(greedy answer, asked digit)`` for each validation prompt, ``ANSWER_DIGITS`` new tokens
    at most (the recipe's limit), in one left-padded transformers ``generate`` call."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
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
            max_new_tokens=ANSWER_DIGITS,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )[:, width:]
    finally:
        torch.set_num_threads(threads)
    texts = tokenizer.batch_decode(out, skip_special_tokens=True)
    return [(text, row["reward_model"]["ground_truth"]) for text, row in zip(texts, rows)]


def exact_accuracy(model_path: Path) -> float:
    """Share of validation prompts answered greedily with the asked digit alone (``3`` ->
    ``3``, ``333``...; an empty answer, a wrong digit or any other character: 0)."""
    answers = greedy_answers(model_path)
    return sum(bool(text) and set(text) == {digit} for text, digit in answers) / len(answers)


def val_reward(model_path: Path) -> float:
    """The task's greedy validation reward (as polyrl's ``val-core/.../mean@1``): 1.0 per
    asked digit, 0.5 per other digit, averaged per answer."""
    answers = greedy_answers(model_path)
    return sum(tiny_digits_score(t, d)["score"] for t, d in answers) / len(answers)
