"""The hf rollout engine as this folder's tests build it: one rank, the tiny tokenizer's pad and
stop ids, ``config`` standing for the rollout node."""

from __future__ import annotations

from typing import Any

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
