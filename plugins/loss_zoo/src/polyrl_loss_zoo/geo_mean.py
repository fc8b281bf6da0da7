"""GMPO (Zhao et al., 2025, arXiv 2507.20673, "Geometric-Mean Policy Optimization"): optimise
the GEOMETRIC mean of a response's token ratios, clipped per token in log space.

GRPO's arithmetic mean of token ratios is dominated by outlier tokens whose ratio exploded;
the geometric mean ``exp(mean_t log r_t)`` is far less sensitive to them, which allows a wider
clip range (the paper uses ``(e^-0.4, e^0.4)``: ``clip_ratio_low=clip_ratio_high=0.4`` here,
because the clip applies to ``log r``). Per response ``i`` with sign ``s = sign(A)``:

    l_t   = s * min(s * log r_t, s * clip(log r_t, -eps_low, eps_high))     (pessimistic side)
    L_i   = -mean_t(A_t) * exp(mean_t l_t)

Aggregation: one loss per response, averaged over the responses; verl ignores
``actor_rollout_ref.actor.loss_agg_mode`` for it, and so does this sequence-level loss.
(verl's mean also counts all-padding rows; polyrl's sequence-level average counts only rows
with a response, which differs only for padding rows added to fill a data-parallel split.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import clip_ratios, masked_mean
from polyrl_loss_zoo.ratios import row_mean

if TYPE_CHECKING:
    from polyrl.api import Batch


def geo_mean_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GMPO's loss per row ``[B]``; metrics ``pg_clipfrac`` (share of tokens whose log-ratio was
    clipped where ``A > 0``), ``pg_clipfrac_lower`` (the same where ``A < 0``), ``ppo_kl``."""
    mask = batch["response_mask"]
    advantages = batch["advantages"]
    low, high = clip_ratios(config)
    log_ratio = log_prob - batch["old_log_probs"]  # unclamped, as in verl: the clip bounds it
    clipped = torch.clamp(log_ratio, -low, high)
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    seq_ratio = torch.exp(row_mean(pessimistic, mask))
    loss = -row_mean(advantages, mask) * seq_ratio
    with torch.no_grad():
        was_clipped = (log_ratio != clipped).to(log_prob.dtype)
        metrics = {
            "pg_clipfrac": masked_mean(was_clipped * (advantages > 0), mask),
            "pg_clipfrac_lower": masked_mean(was_clipped * (advantages < 0), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return loss, metrics
