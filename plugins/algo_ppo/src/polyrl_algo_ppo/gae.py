"""Generalized Advantage Estimation (Schulman et al., 2016), ``algorithm.adv_estimator=gae``.

Per response token ``t`` with reward ``r_t`` and the critic's value ``V_t`` (of the state in which
token ``t`` is chosen)::

    delta_t = r_t + gamma * V_{t+1} - V_t          (V after the last token is 0)
    A_t     = delta_t + gamma * lam * A_{t+1}
    returns = A + V                                 (the critic's regression target)

A position outside ``response_mask`` is skipped, not a step of the recursion: the value and the
advantage of the next real token carry across it (as verl does for observation tokens in
multi-turn responses). The advantages are then whitened over the real tokens of the batch (mean
0, unit variance, the unbiased variance); ``returns`` keep the reward's scale. Both are 0 on
padding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import masked_whiten

if TYPE_CHECKING:
    from polyrl.api import Batch


@torch.no_grad()
def gae_advantages_returns(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, returns)`` of the recursion above, ``[B, T]`` each, before whitening."""
    real = response_mask.bool()
    rows, length = token_level_rewards.shape
    next_value = token_level_rewards.new_zeros(rows)
    next_advantage = token_level_rewards.new_zeros(rows)
    advantages = torch.zeros_like(token_level_rewards)
    for t in range(length - 1, -1, -1):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_value = torch.where(real[:, t], values[:, t], next_value)
        next_advantage = torch.where(real[:, t], advantage, next_advantage)
        advantages[:, t] = next_advantage
    return advantages, advantages + values


def gae_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator registered as ``gae``: reads ``token_level_rewards``, ``values`` and
    ``response_mask``, and ``algorithm.gamma`` / ``algorithm.lam`` from ``config``."""
    mask = batch["response_mask"].to(torch.float32)
    rewards = batch["token_level_rewards"].to(torch.float32)
    values = batch["values"].to(torch.float32)
    advantages, returns = gae_advantages_returns(
        rewards, values, mask, float(config.gamma), float(config.lam)
    )
    return masked_whiten(advantages, mask) * mask, returns * mask
