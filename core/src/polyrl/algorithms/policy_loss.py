"""The PPO clipped-surrogate policy loss (built-in ``vanilla``), with DAPO's separate low/high
clip ratios and the dual clip of Ye et al. (2020) for negative advantages.

Per token, with ``r = pi / pi_old`` and advantage ``A``:

    L = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))          (PPO, pessimistic bound)
    L = min(L, -A * c)                            if A < 0               (dual clip, c > 1)

Without the dual clip a negative-advantage token whose ratio has exploded (r >> 1) gives an
unbounded loss and gradient; ``min(., -A * c)`` caps it at ``|A| * c`` (and zeroes its gradient).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.algorithms.functional import masked_mean
from polyrl.errors import ConfigError

if TYPE_CHECKING:
    from polyrl.batch import Batch

LOG_RATIO_CLAMP = 20.0


def clip_ratios(config: Any) -> tuple[float, float]:
    """``(clip_ratio_low, clip_ratio_high)`` of the ``actor_rollout_ref.actor`` node.

    The schema declares both ``None``, meaning "the symmetric ``clip_ratio``": setting only
    ``clip_ratio`` keeps PPO's symmetric range, and DAPO's clip-higher sets just one side.
    """
    low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    low, high = float(low), float(high)
    if low < 0 or high < 0:
        raise ConfigError(
            f"actor_rollout_ref.actor.clip_ratio_low/high must be >= 0, got low={low}, high={high}"
        )
    return low, high


def clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic per-token bound ``max(-A * r, -A * clip(r, 1 - low, 1 + high))`` with
    ``r = exp(log_ratio)``, and a boolean tensor (no gradient) of where the clipped branch was
    taken, for the ``pg_clipfrac`` metric.

    Shared by every ratio-clipping loss (token ratios here, GSPO's sequence ratio in the
    algo_grpo plugin): they differ only in how ``log_ratio`` is formed and what they add on top.
    """
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    with torch.no_grad():
        clipped = loss_clipped > loss_unclipped
    return torch.maximum(loss_unclipped, loss_clipped), clipped


def vanilla_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token PPO loss ``[B, T]`` (zero on padding) and metrics over the masked tokens:
    ``pg_clipfrac`` (share of tokens where the clipped branch was taken), ``pg_clipfrac_lower``
    (share where the dual clip was taken) and ``ppo_kl`` (mean of ``old_log_probs - log_prob``).

    Reads ``old_log_probs``, ``advantages`` and ``response_mask`` from ``batch``, and
    ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high`` and ``clip_ratio_c`` from ``config``
    (the ``actor_rollout_ref.actor`` node).
    """
    old_log_prob = batch["old_log_probs"]
    advantages = batch["advantages"]
    response_mask = batch["response_mask"]
    low, high = clip_ratios(config)
    clip_c = float(config.clip_ratio_c)
    if clip_c <= 1.0:
        raise ConfigError(
            f"actor_rollout_ref.actor.clip_ratio_c must be > 1 (the dual-clip bound is "
            f"|A| * clip_ratio_c), got {clip_c}; the usual value is 3.0"
        )

    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ppo_loss, clipped = clipped_surrogate(log_ratio, advantages, low, high)
    dual_bound = -advantages * clip_c
    negative = advantages < 0
    loss_mat = torch.where(negative, torch.minimum(ppo_loss, dual_bound), ppo_loss)
    loss_mat = torch.where(response_mask != 0, loss_mat, torch.zeros_like(loss_mat))

    with torch.no_grad():
        dual_clipped = (negative & (ppo_loss > dual_bound)).to(log_prob.dtype)
        metrics = {
            "pg_clipfrac": masked_mean(clipped.to(log_prob.dtype), response_mask),
            "pg_clipfrac_lower": masked_mean(dual_clipped, response_mask),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
        }
    return loss_mat, metrics
