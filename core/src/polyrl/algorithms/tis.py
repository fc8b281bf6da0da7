"""Truncated importance sampling (TIS): the correction for samples the rollout engine drew from a
policy other than the one the trainer computes ``old_log_probs`` with.

The policy-gradient estimate assumes the responses were sampled from ``pi_old`` (the trainer's
policy before this update). They were sampled by the rollout engine, whose probabilities differ:
by numerics alone (another kernel, dtype or engine) and, in one-step off-policy training, by a
whole update (the engine still runs the previous version while the trainer steps). Weighting each
token's loss by ``pi_old / pi_rollout`` restores the on-policy expectation; truncating the weight
at ``C`` (``actor_rollout_ref.actor.tis_imp_ratio_cap``, verl's key) bounds the variance a rare
token with a tiny rollout probability would otherwise bring (Yao et al., 2025, "Your efficient RL
framework secretly brings you off-policy RL training")::

    w = min(exp(old_log_probs - rollout_log_probs), C)        per token, no gradient
"""

from __future__ import annotations

import torch

from polyrl.algorithms.functional import masked_mean

# The same bound the PPO ratio uses: exp(20) is far above any sensible cap and keeps exp finite.
LOG_RATIO_CLAMP = 20.0


def truncated_is_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token weights ``min(pi_old / pi_rollout, cap)`` ``[B, T]`` (detached) and their
    metrics over the response tokens: ``tis_weight_mean`` (mean weight after truncation) and
    ``tis_clipfrac`` (share of tokens whose ratio exceeded ``cap``)."""
    with torch.no_grad():
        log_ratio = torch.clamp(
            old_log_probs - rollout_log_probs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
        )
        ratio = torch.exp(log_ratio)
        weights = torch.clamp(ratio, max=float(cap))
        metrics = {
            "tis_weight_mean": masked_mean(weights, response_mask),
            "tis_clipfrac": masked_mean((ratio > cap).to(weights.dtype), response_mask),
        }
    return weights, metrics
