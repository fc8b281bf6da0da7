"""Decoupled PPO (Fu et al., 2025, "AReaL"): the PPO objective for samples drawn by a stale
behaviour policy.

Off-policy training has three policies: the behaviour policy ``pi_behav`` that sampled the
response (the rollout engine's log-probs, ``rollout_log_probs``, possibly several versions
old), the proximal policy ``pi_prox`` that the trust region is centred on (the trainer's
recomputed log-probs before this update, ``old_log_probs``), and the policy being trained.
Standard PPO conflates the first two; clipping around a stale policy would let the update
drift far from the current weights. Decoupled PPO clips the ratio to the proximal policy and
corrects the sampling with an importance weight between the two older ones::

    r = pi / pi_prox                        w = sg(pi_prox / pi_behav)
    L = w * max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))

Tokens whose ``w`` exceeds ``policy_loss.behav_imp_weight_cap`` are left out (``w`` = 0), as
AReaL does: a rare behaviour token would otherwise carry a huge weight. Unlike the truncated
importance-sampling correction (``tis_imp_ratio_cap``, which multiplies the whole loss by a
capped weight) it must not be combined with TIS: both would correct for the same gap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import (
    TIS_CAP_KEY,
    ConfigError,
    clip_ratios,
    clipped_surrogate,
    masked_mean,
    tis_enabled,
)
from polyrl_loss_zoo.ratios import clamped_log_ratio, on_response

if TYPE_CHECKING:
    from polyrl.api import Batch

CAP_KEY = "actor_rollout_ref.actor.policy_loss.behav_imp_weight_cap"


def behaviour_weight_cap(config: Any) -> float | None:
    """``policy_loss.behav_imp_weight_cap`` of the actor node: None, or a number > 1."""
    cap = config.policy_loss.behav_imp_weight_cap
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int | float) or cap <= 1:
        raise ConfigError(
            f"{CAP_KEY}={cap!r} must be a number > 1 (tokens whose pi_prox/pi_behav exceeds it "
            f"are left out; 5.0 is usual) or null (none is left out)"
        )
    return float(cap)


def check_decoupled_config(cfg: Any) -> list[str]:
    """``polyrl validate``'s check: the cap in range, and no TIS on top of the correction."""
    problems = []
    try:
        behaviour_weight_cap(cfg.actor_rollout_ref.actor)
    except ConfigError as exc:
        problems.append(str(exc))
    cap = cfg.actor_rollout_ref.actor.tis_imp_ratio_cap
    if isinstance(cap, int | float) and tis_enabled(cap):
        problems.append(
            f"actor_rollout_ref.actor.policy_loss.loss_mode=decoupled_ppo corrects for the "
            f"rollout's policy itself, and {TIS_CAP_KEY}={cap:g} would correct a second time: "
            f"set {TIS_CAP_KEY}=-1"
        )
    return problems


def decoupled_ppo_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token decoupled PPO loss ``[B, T]``; metrics ``pg_clipfrac``, ``ppo_kl`` (against
    the proximal policy), ``behav_weight_mean`` (after the cap), ``behav_kl`` (mean of
    ``log pi_prox - log pi_behav``) and ``behav_capped_frac`` (share of tokens left out)."""
    mask = batch["response_mask"]
    low, high = clip_ratios(config)
    cap = behaviour_weight_cap(config)
    log_ratio = clamped_log_ratio(log_prob, batch["old_log_probs"])
    surrogate, clipped = clipped_surrogate(log_ratio, batch["advantages"], low, high)
    with torch.no_grad():
        behav_log_ratio = clamped_log_ratio(batch["old_log_probs"], batch["rollout_log_probs"])
        weight = torch.exp(behav_log_ratio)
        capped = weight > cap if cap is not None else torch.zeros_like(weight, dtype=torch.bool)
        weight = torch.where(capped, torch.zeros_like(weight), weight)
        metrics = {
            "pg_clipfrac": masked_mean(clipped.to(log_prob.dtype), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "behav_weight_mean": masked_mean(weight, mask),
            "behav_kl": masked_mean(behav_log_ratio, mask),
            "behav_capped_frac": masked_mean(capped.to(log_prob.dtype), mask),
        }
    return on_response(weight * surrogate, mask), metrics
