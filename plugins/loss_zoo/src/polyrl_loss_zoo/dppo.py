"""DPPO (arXiv 2602.04879): a trust region on the token's PROBABILITY instead of its ratio.

The ratio ``pi / pi_old`` of a rare token swings wildly for a tiny change of probability, so
ratio clipping over-restricts rare tokens and under-restricts common ones. DPPO masks a token
out of the update only when the divergence between the two binary distributions (the token /
every other token) left the region in the direction the advantage pushes:

- ``dppo_tv``: total variation ``pi - pi_old``; ``A > 0`` needs ``pi - pi_old <= eps_high``,
  ``A <= 0`` needs ``pi - pi_old >= -eps_low``.
- ``dppo_kl``: the binary KL ``p_old log(p_old/p) + (1-p_old) log((1-p_old)/(1-p))``;
  ``A > 0`` needs it ``<= eps_high`` or ``pi <= pi_old``, ``A <= 0`` needs it ``<= eps_low`` or
  ``pi >= pi_old``.

``clip_ratio`` / ``clip_ratio_low`` / ``clip_ratio_high`` are these divergence thresholds here
(as in verl). The kept tokens' policy gradient ``-A * w * log pi`` carries the ratio ``w``
truncated at ``clip_ratio_c`` and detached (truncated importance sampling in place of PPO's dual
clip); the paper recommends a large ``clip_ratio_c`` to keep the truncation bias small.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import clip_ratios, masked_mean
from polyrl_loss_zoo.ratios import clamped_log_ratio, on_response

if TYPE_CHECKING:
    from polyrl.api import Batch

# (log_prob, old_log_prob, advantages, low, high) -> bool [B, T]: the tokens inside the region
TrustRegion = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, float], torch.Tensor]

BINARY_KL_EPS = 1e-8  # keeps log((1 - p_old) / (1 - p)) finite at p = 1


def total_variation_region(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    low: float,
    high: float,
) -> torch.Tensor:
    change = torch.exp(log_prob) - torch.exp(old_log_prob)
    return torch.where(advantages > 0, change <= high, change >= -low)


def binary_kl(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(pi_old) || Bernoulli(pi)) of each token's probability."""
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    rest = torch.log((1.0 - old_prob + BINARY_KL_EPS) / (1.0 - prob + BINARY_KL_EPS))
    return old_prob * (old_log_prob - log_prob) + (1.0 - old_prob) * rest


def binary_kl_region(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    low: float,
    high: float,
) -> torch.Tensor:
    kl = binary_kl(log_prob, old_log_prob)
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    upward = (kl <= high) | (prob <= old_prob)
    downward = (kl <= low) | (prob >= old_prob)
    return torch.where(advantages > 0, upward, downward)


def _dppo_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any, inside: TrustRegion
) -> tuple[torch.Tensor, dict[str, Any]]:
    mask = batch["response_mask"]
    old_log_prob = batch["old_log_probs"]
    advantages = batch["advantages"]
    low, high = clip_ratios(config)
    cap = float(config.clip_ratio_c)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, max=cap).detach()
    with torch.no_grad():
        kept = inside(log_prob, old_log_prob, advantages, low, high)
        kept = kept.to(log_prob.dtype)
    loss = -advantages * weight * log_prob * kept
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(1.0 - kept, mask),
            "pg_clipfrac_lower": masked_mean((ratio > cap).to(log_prob.dtype) * kept, mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return on_response(loss, mask), metrics


def dppo_tv_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO-Binary-TV per-token loss ``[B, T]``; ``pg_clipfrac``: share of tokens masked out,
    ``pg_clipfrac_lower``: share kept with a truncated weight, ``ppo_kl``."""
    return _dppo_loss(batch, log_prob, config, total_variation_region)


def dppo_kl_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO-Binary-KL per-token loss ``[B, T]``, metrics as :func:`dppo_tv_policy_loss`."""
    return _dppo_loss(batch, log_prob, config, binary_kl_region)
