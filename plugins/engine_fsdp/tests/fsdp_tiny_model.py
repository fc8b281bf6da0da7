"""A tiny random Qwen2 with an offline byte-level BPE tokenizer, and batches in polyrl's layout.

polyrl's ``tiny`` shape (head dim 64, which vLLM's CPU attention needs later) with this file's
smaller tokenizer; tied embeddings by default, like small Qwen2 / SmolLM2.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

VOCAB = 272


def build_tiny_model(path: str, tie: bool = True, seed: int = 0) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    from polyrl.models.shapes import random_model_config

    os.makedirs(path, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["the cat sat on the mat. 1 + 2 = 3. " * 4] * 8, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(path)

    torch.manual_seed(seed)
    config = random_model_config(
        "tiny",
        vocab_size=VOCAB,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.eos_token_id,
    )
    model = Qwen2ForCausalLM(config)
    # Larger-than-default init so that log-probs differ visibly between tokens.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.08)
    model.save_pretrained(path)
    return path


def scenario_on_one_rank(factory: Any, scenario: Callable[..., dict]) -> dict:
    """What ``scenario(rank, world, path)`` returns on one gloo rank, over a tied tiny model
    built in a new folder of ``factory`` (pytest's ``tmp_path_factory``)."""
    from polyrl_engine_kit.launch import run_on_ranks

    path = build_tiny_model(str(factory.mktemp("tiny") / "tied"), tie=True, seed=0)
    return run_on_ranks(scenario, 1, path, timeout_s=240)[0]


def make_batch(
    prompt_lens: list[int],
    response_lens: list[int],
    prompt_width: int,
    response_width: int,
    seed: int = 0,
    vocab: int = VOCAB,
) -> dict[str, torch.Tensor]:
    """Left-padded prompts + right-padded responses, as the rollout returns them."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(prompt_lens)
    width = prompt_width + response_width
    input_ids = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        input_ids[i, prompt_width - p : prompt_width + r] = torch.randint(
            1, vocab, (p + r,), generator=gen
        )
        mask[i, prompt_width - p : prompt_width + r] = 1
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    responses = input_ids[:, prompt_width:].clone()
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": position_ids,
        "responses": responses,
        "response_mask": mask[:, prompt_width:].clone(),
    }
