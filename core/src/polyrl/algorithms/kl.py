"""KL divergence estimators between the policy and the reference, and the KL coefficient
controllers used when the KL goes into the reward (``algorithm.use_kl_in_reward``).

Per token, with ``d = log_prob - ref_log_prob`` (Schulman, "Approximating KL divergence"):

- ``kl`` / ``k1``: ``d`` -- unbiased for KL(pi || ref) under samples of pi, but high variance
  and negative on some tokens.
- ``abs``: ``|d|``.
- ``mse`` / ``k2``: ``d^2 / 2`` -- biased, low variance; its gradient is the true KL gradient.
- ``low_var_kl`` / ``k3``: ``exp(-d) + d - 1`` -- unbiased, never negative, low variance;
  clamped to ``[-10, 10]`` because ``exp(-d)`` explodes when the reference assigns a token far
  more probability than the policy.

A ``+`` suffix (``k1+``, ``k3+``, ``low_var_kl+`` ...) keeps that estimator's VALUE but takes its
gradient from ``k2``, whose gradient is the unbiased KL gradient (the straight-through trick
verl calls "k3+").
"""

from __future__ import annotations

from typing import Any

import torch

from polyrl.algorithms.functional import masked_mean
from polyrl.errors import ConfigError

_ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
_ESTIMATOR_NAMES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_PENALTY_TYPES = _ESTIMATOR_NAMES + tuple(f"{name}+" for name in _ESTIMATOR_NAMES)
"""Every name :func:`kl_penalty` accepts (``algorithm.kl_penalty``,
``actor_rollout_ref.actor.kl_loss_type``): each estimator by name or alias, alone or with the
straight-through ``+``. The config validator checks names against this tuple, so that what
``polyrl validate`` accepts and what the run accepts cannot disagree."""
LOW_VAR_KL_CLAMP = 10.0
_EXP_ARG_CLAMP = 20.0


def _kl_value(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    diff = log_prob - ref_log_prob
    if kind == "kl":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff.square()
    # low_var_kl: with x = ref - logp, kl = e^x - x - 1 (>= 0)
    x = torch.clamp(-diff, -_EXP_ARG_CLAMP, _EXP_ARG_CLAMP)
    return torch.clamp(torch.exp(x) - x - 1.0, -LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of the given ``kind`` (see the module doc)."""
    if kind not in KL_PENALTY_TYPES:
        valid = ", ".join(_ESTIMATOR_NAMES)
        raise ConfigError(
            f"unknown KL estimator {kind!r}; valid: {valid} (add '+' for a k2 gradient), set by "
            f"algorithm.kl_penalty or actor_rollout_ref.actor.kl_loss_type"
        )
    straight_through = kind.endswith("+")
    base = kind.removesuffix("+")
    base = _ALIASES.get(base, base)
    value = _kl_value(log_prob, ref_log_prob, base)
    if not straight_through:
        return value
    grad_path = _kl_value(log_prob, ref_log_prob, "mse")
    return grad_path - grad_path.detach() + value.detach()


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


class AdaptiveKLController:
    """Ziegler et al. (2019): move the coefficient so the observed KL tracks ``target_kl``.

    Each update multiplies the coefficient by ``1 + e * n_steps / horizon`` with the proportional
    error ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``: too much KL raises the penalty,
    too little lowers it, and the clip bounds the change per update.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ConfigError(
                f"the adaptive KL controller needs algorithm.kl_ctrl.target_kl > 0 and "
                f"algorithm.kl_ctrl.horizon > 0, got target_kl={target_kl}, horizon={horizon}"
            )
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(kl_ctrl_config: Any) -> KLController:
    """Build the controller the ``algorithm.kl_ctrl`` node describes (``type``: fixed |
    adaptive)."""
    kind = kl_ctrl_config.type
    if kind == "fixed":
        return FixedKLController(kl_ctrl_config.kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            kl_ctrl_config.kl_coef, kl_ctrl_config.target_kl, kl_ctrl_config.horizon
        )
    raise ConfigError(f"unknown algorithm.kl_ctrl.type {kind!r}; valid: fixed, adaptive")


def apply_kl_in_reward(
    token_level_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    controller: KLController,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Subtract ``beta * KL`` from the scores token by token and update the controller.

    ``beta`` is the coefficient before this update (it is what shaped these rewards, and what
    the metric ``actor/reward_kl_penalty_coeff`` reports). The controller sees the batch's mean
    over sequences of each sequence's mean token KL (``actor/reward_kl_penalty``), with
    ``n_steps`` = number of sequences.
    """
    mask = response_mask.to(token_level_scores.dtype)
    with torch.no_grad():
        kld = kl_penalty(log_prob, ref_log_prob, kind)
        kld = torch.where(mask != 0, kld, torch.zeros_like(kld))
    beta = controller.value
    rewards = (token_level_scores - beta * kld) * mask
    current_kl = float(masked_mean(kld, mask, dim=-1).mean().item())
    controller.update(current_kl, n_steps=int(token_level_scores.shape[0]))
    return rewards, {
        "actor/reward_kl_penalty": current_kl,
        "actor/reward_kl_penalty_coeff": float(beta),
    }
