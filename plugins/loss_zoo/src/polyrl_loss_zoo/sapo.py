"""SAPO (Qwen, 2025, arXiv 2511.20347, "Soft Adaptive Policy Optimization"): a smooth gate on
the ratio instead of a hard clip.

Per token, with ``r = pi / pi_old`` and ``tau = tau_pos`` where ``A > 0`` else ``tau_neg``:

    f(r) = sigmoid(tau * (r - 1)) * 4 / tau,      L_t = -f(r) * A

At ``r = 1`` the gate's slope is 1, so on-policy it is the plain policy gradient; away from 1 the
gradient fades smoothly (faster for larger ``tau``), where PPO's clip cuts it off at once.

Aggregation: verl averages the tokens of each response and then the responses
(``seq-mean-token-mean``) whatever ``actor_rollout_ref.actor.loss_agg_mode`` says, so this loss
is sequence-level: it returns each row's token mean and the actor averages the rows;
``loss_agg_mode`` does not apply to it (the entropy and KL terms still use it, as in verl).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import masked_mean
from polyrl_loss_zoo.ratios import clamped_log_ratio, row_mean

if TYPE_CHECKING:
    from polyrl.api import Batch


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """SAPO's soft gate ``sigmoid(tau * (r - 1)) * 4 / tau``."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


def sapo_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """SAPO's loss per row ``[B]`` (the row's token mean of ``-f(r) * A``) and metrics
    ``pg_clipfrac`` / ``pg_clipfrac_lower`` (0: nothing is clipped) and ``ppo_kl``.

    Reads ``tau_pos`` and ``tau_neg`` from ``config`` (the ``actor_rollout_ref.actor`` node)."""
    mask = batch["response_mask"]
    advantages = batch["advantages"]
    log_ratio = clamped_log_ratio(log_prob, batch["old_log_probs"])
    options = {"dtype": advantages.dtype, "device": advantages.device}
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(float(config.tau_pos), **options),
        torch.as_tensor(float(config.tau_neg), **options),
    )
    token_loss = -sapo_gate(torch.exp(log_ratio), tau) * advantages
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": 0.0,
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return row_mean(token_loss, mask), metrics


def check_sapo_config(cfg: Any) -> list[str]:
    """The gate divides by its temperatures: both must be positive."""
    actor = cfg.actor_rollout_ref.actor
    return [
        f"actor_rollout_ref.actor.{key}={getattr(actor, key)} must be > 0 for loss_mode=sapo "
        f"(verl's defaults: tau_pos=1.0, tau_neg=1.05)"
        for key in ("tau_pos", "tau_neg")
        if not float(getattr(actor, key)) > 0
    ]
