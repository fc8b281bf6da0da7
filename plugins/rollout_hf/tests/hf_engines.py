"""The hf rollout engine as this folder's tests build it (one rank, the tiny tokenizer's pad and
stop ids, ``config`` standing for the rollout node), and a tiny model with grouped-query
attention."""

from __future__ import annotations

from typing import Any

import torch

from polyrl.interfaces import RolloutContext
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID
from polyrl_rollout_hf.engine import HFRolloutEngine


def hf_engine(path: str, config: Any, device: str = "cpu") -> HFRolloutEngine:
    return HFRolloutEngine(
        RolloutContext(
            model_path=path,
            config=config,
            device=device,
            rank=0,
            world_size=1,
            pad_token_id=PAD_TOKEN_ID,
            eos_token_ids=[EOS_TOKEN_ID],
        )
    )


def build_gqa_model(out_dir: str, seed: int = 0) -> str:
    """A tiny Qwen2 with 4 query heads over 2 KV heads (grouped-query attention, like
    Qwen2-0.5B's 14 over 2), saved with the tiny tokenizer's special ids."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=PAD_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        Qwen2ForCausalLM(config).save_pretrained(out_dir)
    return out_dir
