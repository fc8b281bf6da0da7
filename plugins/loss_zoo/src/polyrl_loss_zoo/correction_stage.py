"""verl's decoupled rollout correction (``algorithm.rollout_correction.*`` with
``bypass_mode=false``): three policies, the rollout's, the trainer's recomputed ``old_log_probs``
and the one being trained. Once per batch, before the advantages, a stage weighs the old policy
against the rollout's and rejects tokens or responses (:mod:`polyrl_loss_zoo.correction`): the
rejection narrows ``response_mask`` (so the advantages, the loss's aggregation, the entropy and
KL terms all leave those tokens out), and the weights reach the actor as
``rollout_is_weights``, which multiply whatever token-level policy loss is selected, as in
verl's trainer. Light on purpose: :func:`edit_step` runs in ``polyrl validate``."""

from __future__ import annotations

from typing import Any

from polyrl.api import (
    TIS_CAP_KEY,
    ConfigError,
    PluginKind,
    PolyrlError,
    Stage,
    StepContext,
    StepPipeline,
    StepState,
    get_registry,
    names,
    tis_enabled,
)
from polyrl_loss_zoo.correction_config import (
    LOSS_MODE_KEY,
    Correction,
    changed_settings,
    parse_correction,
)

STAGE_NAME = "rollout_correction"


class RolloutCorrectionStage(Stage):
    """Weights and rejection of the batch's ``old_log_probs`` against its
    ``rollout_log_probs``; metrics ``rollout_corr/*`` (verl's names)."""

    name = STAGE_NAME
    requires = (names.OLD_LOG_PROBS, names.ROLLOUT_LOG_PROBS, names.RESPONSE_MASK)

    def __init__(self, correction: Correction) -> None:
        self.correction = correction
        weights = (names.ROLLOUT_IS_WEIGHTS,) if correction.rollout_is is not None else ()
        self.provides = (names.RESPONSE_MASK, *weights)

    def run(self, state: StepState, ctx: StepContext) -> None:
        from polyrl_loss_zoo.correction import rollout_correction

        batch = state.batch
        weights, kept, metrics = rollout_correction(
            batch[names.OLD_LOG_PROBS],
            batch[names.ROLLOUT_LOG_PROBS],
            batch[names.RESPONSE_MASK],
            self.correction,
        )
        batch[names.RESPONSE_MASK] = kept
        if weights is not None:
            batch[names.ROLLOUT_IS_WEIGHTS] = weights
        state.metrics.update(metrics)


def edit_step(cfg: Any, pipeline: StepPipeline) -> None:
    """Add :class:`RolloutCorrectionStage` before ``adv`` when the settings ask for the
    decoupled mode (bypass mode is the ``bypass_mode`` loss's), and have the update send the
    weights; what cannot run is one line (:class:`ConfigError`)."""
    node = cfg.algorithm.rollout_correction
    if node.bypass_mode or not changed_settings(cfg):
        return
    correction = parse_correction(node)
    given = ", ".join(f"{key}={value}" for key, value in changed_settings(cfg))
    cap = cfg.actor_rollout_ref.actor.tis_imp_ratio_cap
    if isinstance(cap, int | float) and tis_enabled(cap):
        raise ConfigError(
            f"{given} corrects for the rollout's policy already, and {TIS_CAP_KEY}={cap:g} "
            f"would correct a second time: set {TIS_CAP_KEY}=-1"
        )
    missing = [s for s in (names.STAGE_ADV, names.STAGE_UPDATE_ACTOR) if s not in pipeline]
    update = None if missing else _update_stage(pipeline[names.STAGE_UPDATE_ACTOR])
    if update is None:
        raise ConfigError(
            f"{given} (verl's decoupled rollout correction) weighs the samples before the "
            f"advantages and in the actor's update, which the selected algorithm's step "
            f"({', '.join(pipeline.names())}) does not have"
        )
    if correction.rollout_is is not None and _loss_level(cfg) == "sequence":
        raise ConfigError(
            f"{given}: the importance weights are per token, and the policy loss "
            f"{LOSS_MODE_KEY}={cfg.actor_rollout_ref.actor.policy_loss.loss_mode} is "
            f"sequence-level; use a token-level loss or rollout_is=null"
        )
    pipeline.insert_before(names.STAGE_ADV, RolloutCorrectionStage(correction))
    if correction.rollout_is is not None:
        update.send(names.ROLLOUT_IS_WEIGHTS)


def _update_stage(stage: Any) -> Any:
    """Core's update stage (it can send more keys), also inside a wrapper that runs it on some
    steps only (PPO's critic warm-up keeps it as ``.stage``); None for another update."""
    while not hasattr(stage, "send") and hasattr(stage, "stage"):
        stage = stage.stage
    return stage if hasattr(stage, "send") else None


def _loss_level(cfg: Any) -> str | None:
    """The selected policy loss's level (None when it is unknown: reported elsewhere)."""
    try:
        loss = get_registry().get(
            PluginKind.POLICY_LOSS, str(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
        )
    except PolyrlError:
        return None
    return getattr(loss.spec, "level", None)
