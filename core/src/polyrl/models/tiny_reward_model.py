"""A tiny reward model for tests: the tiny Qwen2 with a one-score head, trained for seconds on
the CPU to score the share of digits in a response.

Why: the reward-model path (role, stage, ``reward_model.combine``) needs a real
``AutoModelForSequenceClassification`` folder that shares the tiny policy's tokenizer, prefers
something a test can check, and exists offline. Its backbone starts from the tiny policy's
weights (as reward models start from the policy's checkpoint); it is trained by regression on
prompts of the tiny task followed by random responses in the rollout's layout (left-padded
prompt, right-padded response), so it scores the policy's own samples. Deterministic per seed.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from polyrl.models.cache import build_once, default_cache_dir
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model

MAX_RESPONSE_TOKENS = 16


def _digit_ids(tokenizer) -> set[int]:
    return {tokenizer.convert_tokens_to_ids(str(digit)) for digit in range(10)}


def digit_share(response_ids: list[int], digit_ids: set[int]) -> float:
    """The share of digit tokens among a response's tokens before its EOS (0 when empty): what
    the tiny reward model learns to output."""
    body = (
        response_ids[: response_ids.index(EOS_TOKEN_ID)]
        if EOS_TOKEN_ID in response_ids
        else response_ids
    )
    return sum(token in digit_ids for token in body) / len(body) if body else 0.0


def _random_response(rng: random.Random, vocab: list[int], digits: list[int]) -> list[int]:
    """1..16 tokens, each a digit with one probability per response, sometimes ended by EOS."""
    length, p_digit = rng.randint(1, MAX_RESPONSE_TOKENS), rng.random()
    ids = [
        rng.choice(digits) if rng.random() < p_digit else rng.choice(vocab) for _ in range(length)
    ]
    if length < MAX_RESPONSE_TOKENS and rng.random() < 0.5:
        ids.append(EOS_TOKEN_ID)
    return ids


def _training_batch(rng, prompts, vocab, digits, digit_set, size):
    import torch

    rows = [(rng.choice(prompts), _random_response(rng, vocab, digits)) for _ in range(size)]
    prompt_width = max(len(p) for p, _ in rows)
    width = prompt_width + max(len(r) for _, r in rows)
    input_ids = torch.full((size, width), PAD_TOKEN_ID)
    mask = torch.zeros_like(input_ids)
    for row, (prompt, response) in enumerate(rows):
        start, stop = prompt_width - len(prompt), prompt_width + len(response)
        input_ids[row, start:stop] = torch.tensor(prompt + response)
        mask[row, start:stop] = 1
    targets = torch.tensor([digit_share(r, digit_set) for _, r in rows])
    return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), targets


def build_tiny_reward_model(
    out_dir: str, *, seed: int = 0, steps: int = 400, batch_size: int = 32
) -> str:
    """Write the tiny reward model (float32 safetensors, the tiny tokenizer) into ``out_dir`` and
    return it. About 30 s on one idle CPU core at the defaults; the global torch RNG is left as it
    was."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForSequenceClassification

    from polyrl.data.generate import tiny_digits_rows

    build_tiny_model(out_dir, seed=seed)  # the tokenizer and the backbone's weights
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    digit_set = _digit_ids(tokenizer)
    digits = sorted(digit_set)
    vocab = [i for i in range(3, len(tokenizer)) if i not in digit_set]
    prompts = [
        tokenizer(
            tokenizer.apply_chat_template(
                row["prompt"], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )["input_ids"]
        for row in tiny_digits_rows(size=64, seed=seed, split="train")
    ]
    rng = random.Random(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification.from_pretrained(
            out_dir, num_labels=1, dtype=torch.float32
        )
        model.config.pad_token_id = PAD_TOKEN_ID
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        model.train()
        for _ in range(steps):
            input_ids, mask, positions, targets = _training_batch(
                rng, prompts, vocab, digits, digit_set, batch_size
            )
            scores = model(input_ids=input_ids, attention_mask=mask, position_ids=positions).logits
            loss = torch.nn.functional.mse_loss(scores[:, 0], targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    for leftover in ("generation_config.json", "polyrl_tiny.json"):
        Path(out_dir, leftover).unlink(missing_ok=True)
    from polyrl.models.saving import save_hf_model

    save_hf_model(model, out_dir, safe_serialization=True)
    return os.fspath(out_dir)


def tiny_reward_model_path(*, seed: int = 0, cache_dir: str | None = None) -> str:
    """The tiny reward model of ``seed``, built once into the cache (``$POLYRL_CACHE_DIR`` or
    ``~/.cache/polyrl``, under ``builtin/``) and reused by every later call."""
    cache = Path(cache_dir or default_cache_dir()).expanduser()
    return build_once(
        cache / "builtin" / f"tiny-reward-seed{seed}",
        lambda tmp: build_tiny_reward_model(tmp, seed=seed),
    )
