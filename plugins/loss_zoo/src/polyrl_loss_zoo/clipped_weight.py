"""CISPO (MiniMax, 2025, "MiniMax-M1"): clip the importance-sampling WEIGHT, not the update.

PPO's clip zeroes the gradient of a token whose ratio left the trust region, so rare tokens
that matter for reflection ("wait", "however") stop learning after one step. CISPO keeps every
token's gradient and bounds only its weight:

    L = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi,   r = pi / pi_old

with ``clip_ratio_low`` / ``clip_ratio_high`` (or ``clip_ratio``) as the bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import clip_ratios, masked_mean
from polyrl_loss_zoo.ratios import clamped_log_ratio, on_response

if TYPE_CHECKING:
    from polyrl.api import Batch


def cispo_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token CISPO loss ``[B, T]``; metrics ``pg_clipfrac`` (share of tokens whose weight
    was clipped), ``pg_clipfrac_lower`` (0: there is no dual clip) and ``ppo_kl``."""
    mask = batch["response_mask"]
    low, high = clip_ratios(config)
    log_ratio = clamped_log_ratio(log_prob, batch["old_log_probs"])
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - low, 1.0 + high).detach()
    loss = -weight * batch["advantages"] * log_prob
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((ratio != weight).to(log_prob.dtype), mask),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return on_response(loss, mask), metrics
