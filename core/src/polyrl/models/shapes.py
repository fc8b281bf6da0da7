"""Named Qwen2 shapes, and randomly initialised models of them, for tests and benchmarks.

Why: throughput, memory and MFU depend on a model's shape, not on its weights' values, so the
benchmarks build a random-weight model of a published shape instead of downloading a checkpoint,
and tests use a tiny shape that runs in milliseconds. The shapes live here once, so that every
script and test measures the same architecture. Heavy imports happen inside the functions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from polyrl.errors import ConfigError

# hidden 128, 2 heads of dim 64 (vLLM's CPU kernels reject smaller head dims), 2 KV heads,
# 2 layers, MLP 256, tied embeddings. The vocabulary is the tiny tokenizer's upper bound; a
# model built with a tokenizer passes the tokenizer's own size.
QWEN2_TINY: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}

# Qwen2-0.5B's published config (494M parameters).
QWEN2_05B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}

# Qwen2.5-1.5B's published config (1.54B parameters).
QWEN25_15B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}

# Larger published Qwen2.5 configs, for the memory benchmarks (which model fits one GPU).
QWEN25_3B: dict[str, Any] = {
    **QWEN25_15B,
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
}
QWEN25_7B: dict[str, Any] = {
    **QWEN25_15B,
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}
QWEN25_14B: dict[str, Any] = {
    **QWEN25_7B,
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
}

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": QWEN2_TINY,
    "qwen2-0.5b": QWEN2_05B,
    "qwen2.5-1.5b": QWEN25_15B,
    "qwen2.5-3b": QWEN25_3B,
    "qwen2.5-7b": QWEN25_7B,
    "qwen2.5-14b": QWEN25_14B,
}

_DTYPES = ("float32", "bfloat16", "float16")


def random_model_config(shape: str, **overrides: Any):  # -> transformers.Qwen2Config
    """The ``Qwen2Config`` of the named ``shape`` (a key of :data:`SHAPES`); ``overrides``
    (vocabulary size, special-token ids, ...) replace or extend the shape's keys."""
    from transformers import Qwen2Config

    if shape not in SHAPES:
        raise ConfigError(f"unknown model shape {shape!r}; choose one of {sorted(SHAPES)}")
    return Qwen2Config(**{**SHAPES[shape], **overrides})


def build_random_model(
    out_dir: str,
    shape: str = "qwen2-0.5b",
    *,
    tokenizer_from: str | None = "tiny",
    dtype: str = "bfloat16",
    seed: int = 0,
    device: str = "cpu",
) -> str:
    """Write a randomly initialised Qwen2 of ``shape`` (safetensors in ``dtype``) into
    ``out_dir`` and return ``out_dir``.

    ``tokenizer_from``: ``"tiny"`` (the default) adds polyrl's offline tiny tokenizer, whose ids
    are a subset of every shape's vocabulary, so the folder needs no download; a folder path adds
    that folder's tokenizer (and its ``generation_config.json``); either way the config gets the
    tokenizer's special-token ids. ``None`` writes the weights and config only, without
    special-token ids (enough for training benchmarks). Same ``seed``, same weights on one
    ``device``; the global torch RNG is left as it was. ``device="cuda"`` initialises a large
    shape in seconds instead of minutes on the CPU.
    """
    if shape not in SHAPES:
        raise ConfigError(f"unknown model shape {shape!r}; choose one of {sorted(SHAPES)}")
    if dtype not in _DTYPES:
        raise ConfigError(f"build_random_model: dtype must be one of {_DTYPES}, got {dtype!r}")
    if tokenizer_from == "tiny":
        from polyrl.models.tiny import build_tiny_model

        with tempfile.TemporaryDirectory(prefix="polyrl_tiny_tok_") as tiny:
            return build_random_model(
                out_dir,
                shape,
                tokenizer_from=build_tiny_model(tiny),
                dtype=dtype,
                seed=seed,
                device=device,
            )

    import torch
    from transformers import Qwen2ForCausalLM

    token_ids: dict[str, Any] = {}
    tokenizer = None
    if tokenizer_from is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
        vocab = int(SHAPES[shape]["vocab_size"])
        if len(tokenizer) > vocab:
            raise ConfigError(
                f"the tokenizer from {tokenizer_from!r} has {len(tokenizer)} tokens, more than "
                f"the {shape!r} shape's vocabulary of {vocab}; pick a larger shape"
            )
        token_ids = {
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        }
    config = random_model_config(shape, **token_ids)
    cuda = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from polyrl.models.saving import save_hf_model

    save_hf_model(model, str(out))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
        generation = Path(tokenizer_from, "generation_config.json")
        if generation.is_file():
            shutil.copy(generation, out / "generation_config.json")
    params = sum(p.numel() for p in model.parameters())
    (out / "polyrl_random.json").write_text(
        json.dumps({"shape": shape, "seed": seed, "dtype": dtype, "parameters": params})
    )
    return os.fspath(out)
