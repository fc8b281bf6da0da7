"""The keys these losses read, at verl's places and with verl's defaults (mounted into the
schema by polyrl's config composition). Light on purpose (no torch): every composed config
imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
ACTOR = "actor_rollout_ref.actor"


@dataclass
class PolicyLossSettings:
    """``actor_rollout_ref.actor.policy_loss.*`` beside ``loss_mode``.

    Clip-Cov: of the tokens whose covariance of advantage and log-prob lies in
    ``(clip_cov_lb, clip_cov_ub)``, a random ``clip_cov_ratio`` share (of all response tokens)
    loses its gradient. KL-Cov: the ``kl_cov_ratio`` share of tokens with the largest covariance
    get ``ppo_kl_coef * |log ratio|`` added. DRO: ``dro_beta`` weighs the quadratic log-ratio
    penalty; it has no default because verl requires it to be chosen. Decoupled PPO:
    ``behav_imp_weight_cap`` (AReaL's key) leaves out of the loss the tokens whose behaviour
    weight pi_prox / pi_behav exceeds it (> 1; null: none is left out).
    """

    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: Any = None  # a positive float when loss_mode=dro
    behav_imp_weight_cap: Any = None  # a float > 1, or null


@dataclass
class SapoSettings:
    """SAPO's gate temperatures on ``actor_rollout_ref.actor``: ``tau_pos`` for tokens with a
    positive advantage, ``tau_neg`` for the others (larger: negative updates fade faster)."""

    tau_pos: float = 1.0
    tau_neg: float = 1.05


POLICY_LOSS_SECTIONS = {POLICY_LOSS: PolicyLossSettings}
SAPO_SECTIONS = {ACTOR: SapoSettings}
