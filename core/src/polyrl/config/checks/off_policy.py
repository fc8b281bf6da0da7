"""Off-policy training: ``trainer.async_mode`` and the truncated importance-sampling correction
``actor_rollout_ref.actor.tis_imp_ratio_cap``.

``async_mode=one_step_off`` generates the next step's samples while this step trains
(:mod:`polyrl.step.one_step_off`). It is refused where it cannot mean anything: with the rollout
colocated with the actor (one process per device does one thing at a time), without the TIS
correction (the samples come from the previous policy), and for steps that do not generate before
they train (offline DPO) or that call the rollout again after training has begun. Torch-free, like
every check; the step module reads :func:`tis_enabled` from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polyrl.config.checks.checker import Checker, get, is_number
from polyrl.config.checks.placement import pool_of
from polyrl.errors import ConfigError

if TYPE_CHECKING:
    from polyrl.step.pipeline import StepPipeline

ASYNC_MODES = ("sync", "one_step_off")
TIS_CAP_KEY = "actor_rollout_ref.actor.tis_imp_ratio_cap"
# The value of the cap that turns the correction off (verl's convention).
TIS_OFF = -1.0


def tis_enabled(cap: float) -> bool:
    """Whether ``actor_rollout_ref.actor.tis_imp_ratio_cap`` asks for the correction."""
    return float(cap) != TIS_OFF


def check_off_policy(checker: Checker, pipeline: StepPipeline | None) -> None:
    """The TIS cap's range, the async mode's choice, and what one-step off-policy needs.
    ``pipeline`` is the step (None when it could not be built: its checks are then skipped)."""
    cap = checker.number(
        TIS_CAP_KEY,
        lambda v: v == TIS_OFF or v >= 1,
        f"{TIS_OFF:g} (off) or a cap >= 1 on the weight pi_old/pi_rollout (2.0 is usual); a cap "
        f"below 1 would down-weight every token, even on-policy ones",
    )
    mode = checker.choice("trainer.async_mode", ASYNC_MODES)
    has_rollout_log_probs = pipeline is None or any(
        "rollout_log_probs" in stage.provides for stage in pipeline.stages
    )
    if cap is not None and tis_enabled(cap) and not has_rollout_log_probs:
        checker.add(
            f"{TIS_CAP_KEY}={cap:g}: no stage of the selected algorithm's step provides the "
            f"rollout's sampling log-probs the correction weighs by (stages: "
            f"{', '.join(pipeline.names())}); drop the key ({TIS_CAP_KEY}={TIS_OFF:g})"
        )
    if mode != "one_step_off":
        return
    if pool_of(checker.cfg, "rollout") == pool_of(checker.cfg, "actor"):
        checker.add(
            "trainer.async_mode=one_step_off generates the next batch while the actor trains, "
            "which needs the rollout on workers of its own: set "
            "actor_rollout_ref.hybrid_engine=false (a colocated rollout shares each worker with "
            "the actor, so nothing can overlap)"
        )
    if cap is not None and not tis_enabled(cap):
        checker.add(
            f"trainer.async_mode=one_step_off trains on samples of the previous policy, which "
            f"needs the truncated importance-sampling correction: set {TIS_CAP_KEY}=2.0 (or "
            f"another cap >= 1)"
        )
    if pipeline is not None:
        from polyrl.step.one_step_off import split_step

        try:
            split_step(pipeline)
        except ConfigError as exc:
            checker.add(f"trainer.async_mode=one_step_off: {exc}")


def describe_schedule(cfg: Any, pipeline: StepPipeline) -> str:
    """``polyrl validate``'s line on how steps run, e.g. ``schedule: one_step_off (gen, reward
    run one step ahead of old_log_prob -> ... -> update_actor; TIS cap 2)``."""
    mode = get(cfg, "trainer.async_mode")
    cap = get(cfg, TIS_CAP_KEY)
    tis = f"; TIS cap {cap:g}" if is_number(cap) and tis_enabled(cap) else ""
    if mode != "one_step_off":
        return f"schedule: {mode} (generate, train, sync the weights, every step{tis})"
    from polyrl.step.one_step_off import split_step

    try:
        generation, training, _ = split_step(pipeline)
    except ConfigError:
        return f"schedule: {mode} (this step cannot run ahead{tis})"
    return (
        f"schedule: {mode} ({', '.join(generation.names())} run one step ahead of "
        f"{' -> '.join(training.names())}{tis})"
    )
