"""DAPO's soft overlong punishment (Yu et al., 2025), configured by verl's keys
``reward_model.overlong_buffer.{enable,len,penalty_factor,max_resp_len}`` (verl's DAPO reward
manager's ``reward_kwargs.{overlong_buffer_cfg,max_resp_len}``).

A response cut at ``data.max_response_length`` is usually unfinished, and rewarding or punishing
it for its (missing) answer is noise. DAPO instead lowers the reward of long responses smoothly:
nothing up to ``max_resp_len - len`` tokens, then linearly more, down to
``-penalty_factor`` at the limit. As in verl's DAPO reward manager, the penalty is part of the
score itself (``token_level_scores``, so ``critic/score`` includes it) and sits on the
response's last token.
"""

from __future__ import annotations

from typing import Any

import torch

from polyrl.api import Stage, StepContext, StepState
from polyrl_algo_grpo.dapo_settings import buffer_end

SHAPED_KEYS = ("token_level_scores", "token_level_rewards")


def overlong_penalty(
    lengths: torch.Tensor, max_length: int, buffer_length: int, penalty_factor: float
) -> torch.Tensor:
    """``min(0, -(length - (max_length - buffer_length)) / buffer_length * penalty_factor)``
    for each response length (verl's formula)."""
    exceed = lengths.to(torch.float32) - (max_length - buffer_length)
    return (-exceed / buffer_length * penalty_factor).clamp(max=0.0)


class OverlongPenaltyStage(Stage):
    """Adds :func:`overlong_penalty` to the score and the reward of each response's last token.
    Metrics: ``overlong/penalized_frac`` (share of responses penalised) and
    ``overlong/penalty_mean``."""

    name = "overlong_penalty"
    requires = (*SHAPED_KEYS, "response_mask")
    provides = SHAPED_KEYS

    def __init__(self, cfg: Any) -> None:
        buffer = cfg.reward_model.overlong_buffer
        self.max_length = buffer_end(cfg)
        self.buffer_length = int(buffer.len)
        self.penalty_factor = float(buffer.penalty_factor)

    def run(self, state: StepState, ctx: StepContext) -> None:
        batch = state.batch
        mask = batch["response_mask"]
        lengths = mask.sum(-1)
        penalty = overlong_penalty(
            lengths, self.max_length, self.buffer_length, self.penalty_factor
        )
        on_last_token = torch.zeros(mask.shape, dtype=penalty.dtype)
        on_last_token[torch.arange(len(batch)), (lengths - 1).clamp(min=0).long()] = penalty
        on_last_token = on_last_token * (mask != 0)
        for key in SHAPED_KEYS:
            batch[key] = batch[key] + on_last_token.to(batch[key].dtype)
        state.metrics["overlong/penalized_frac"] = float((penalty < 0).float().mean())
        state.metrics["overlong/penalty_mean"] = float(penalty.mean())
