"""Losses on the log-prob itself instead of an importance ratio: GPG and DRO.

GPG (Chu et al., 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline"): plain
REINFORCE, ``-A * log pi``; no ratio, no clip, so it suits on-policy updates (one step per batch).

DRO (Direct Reward Optimization): ``-(A * log pi - beta/2 * (log pi - log pi_old)^2)``; the
quadratic penalty keeps the policy near the one that sampled, in place of a clip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import ConfigError, masked_mean
from polyrl_loss_zoo.ratios import on_response

if TYPE_CHECKING:
    from polyrl.api import Batch

DRO_BETA_KEY = "actor_rollout_ref.actor.policy_loss.dro_beta"


def gpg_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token ``-A * log pi`` ``[B, T]``; no metrics (verl reports none for GPG)."""
    mask = batch["response_mask"]
    return on_response(-log_prob * batch["advantages"], mask), {}


def dro_beta(config: Any) -> float:
    """``policy_loss.dro_beta`` of the actor node, refused unless positive."""
    beta = config.policy_loss.dro_beta
    if beta is None or float(beta) <= 0:
        raise ConfigError(
            f"{DRO_BETA_KEY}={beta}: loss_mode=dro needs a positive penalty weight; "
            f"set e.g. {DRO_BETA_KEY}=0.1"
        )
    return float(beta)


def check_dro_config(cfg: Any) -> list[str]:
    """``polyrl validate``'s check: the penalty weight is set and positive."""
    try:
        dro_beta(cfg.actor_rollout_ref.actor)
    except ConfigError as exc:
        return [str(exc)]
    return []


def dro_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token ``-(A * log pi - beta/2 * r^2)`` with ``r = log pi - log pi_old`` ``[B, T]``
    and ``ppo_kl`` (mean of ``-r`` over the response tokens)."""
    beta = dro_beta(config)
    mask = batch["response_mask"]
    log_ratio = log_prob - batch["old_log_probs"]
    loss = -(log_prob * batch["advantages"] - 0.5 * beta * log_ratio.square())
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(-log_ratio, mask)}
    return on_response(loss, mask), metrics
