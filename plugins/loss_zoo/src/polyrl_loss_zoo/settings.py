"""The keys these losses read, at verl's places and with verl's defaults (mounted into the
schema by polyrl's config composition). Light on purpose (no torch): every composed config
imports it."""

from __future__ import annotations

from dataclasses import dataclass, fields
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


ROLLOUT_CORRECTION = "algorithm.rollout_correction"
# Where verl hands the same settings to the actor's loss (its trainer copies them into
# policy_loss.rollout_correction); here a mirror that follows algorithm.rollout_correction.
LOSS_ROLLOUT_CORRECTION = f"{POLICY_LOSS}.rollout_correction"


@dataclass
class RolloutCorrectionSettings:
    """verl's ``algorithm.rollout_correction.*``: correcting for the gap between the rollout
    engine's sampling policy and the policy being trained.

    ``rollout_is``: importance weights ``pi / pi_rollout`` per ``token`` or per ``sequence``
    (the product over its tokens), truncated at ``rollout_is_threshold``, optionally divided by
    their mean (``rollout_is_batch_normalize``); null: none. ``rollout_rs``: rejection
    criteria, comma-separated (``token_k1,seq_max_k2``), with ``rollout_rs_threshold`` one
    entry per criterion or one for all (``"0.6_1.6,2.5"``: ``lower_upper`` ratio bounds for a
    ``*k1`` criterion, an upper bound for k2/k3). ``bypass_mode``: the rollout's log-probs
    serve as the old ones (no recomputation) and the ``bypass_mode`` loss applies the
    correction, ``loss_type`` ``ppo_clip`` (PPO's ratio to the rollout policy; the weights are
    only logged) or ``reinforce`` (``-w * A * log pi``).
    """

    rollout_is: Any = None  # null, "token" or "sequence"
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: Any = None  # null or comma-separated criteria, e.g. "token_k1,seq_max_k2"
    rollout_rs_threshold: Any = None  # a number, or "0.6_1.6,2.5": one entry per criterion
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"


ROLLOUT_CORRECTION_SECTIONS = {
    ROLLOUT_CORRECTION: RolloutCorrectionSettings,
    LOSS_ROLLOUT_CORRECTION: RolloutCorrectionSettings(
        **{
            name: f"${{{ROLLOUT_CORRECTION}.{name}}}"
            for name in (f.name for f in fields(RolloutCorrectionSettings))
        }
    ),
}
