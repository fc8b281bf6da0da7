"""Off-policy training: the truncated importance-sampling correction
``actor_rollout_ref.actor.tis_imp_ratio_cap``, and the ``schedule:`` line of ``polyrl validate``.

Which schedule runs (``trainer.async_mode``) is a plugin choice like any other; what a schedule
needs of the config (the one-step schedule's split placement and correction) is its plugin's
``config_check``. Torch-free, like every check; the step module reads :func:`tis_enabled` from
here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polyrl.config.checks.checker import Checker, get, is_number

if TYPE_CHECKING:
    from polyrl.registry import Registration
    from polyrl.step.pipeline import StepPipeline

TIS_CAP_KEY = "actor_rollout_ref.actor.tis_imp_ratio_cap"
# The value of the cap that turns the correction off (verl's convention).
TIS_OFF = -1.0


def tis_enabled(cap: float) -> bool:
    """Whether ``actor_rollout_ref.actor.tis_imp_ratio_cap`` asks for the correction."""
    return float(cap) != TIS_OFF


def check_off_policy(checker: Checker, pipeline: StepPipeline | None) -> None:
    """The TIS cap's range, and that some stage provides what it weighs by. ``pipeline`` is the
    step (None when it could not be built: its checks are then skipped)."""
    cap = checker.number(
        TIS_CAP_KEY,
        lambda v: v == TIS_OFF or v >= 1,
        f"{TIS_OFF:g} (off) or a cap >= 1 on the weight pi_old/pi_rollout (2.0 is usual); a cap "
        f"below 1 would down-weight every token, even on-policy ones",
    )
    has_rollout_log_probs = pipeline is None or any(
        "rollout_log_probs" in stage.provides for stage in pipeline.stages
    )
    if cap is not None and tis_enabled(cap) and not has_rollout_log_probs:
        checker.add(
            f"{TIS_CAP_KEY}={cap:g}: no stage of the selected algorithm's step provides the "
            f"rollout's sampling log-probs the correction weighs by (stages: "
            f"{', '.join(pipeline.names())}); drop the key ({TIS_CAP_KEY}={TIS_OFF:g})"
        )


def describe_schedule(cfg: Any, pipeline: StepPipeline, schedule: Registration) -> str:
    """``polyrl validate``'s line on how steps run, e.g. ``schedule: one_step_off (gen, reward
    run one step ahead of old_log_prob -> ... -> update_actor; TIS cap 2)``: the schedule's own
    description of itself, with the correction in force."""
    from polyrl.specs import resolve_object

    cap = get(cfg, TIS_CAP_KEY)
    tis = f"; TIS cap {cap:g}" if is_number(cap) and tis_enabled(cap) else ""
    describe = getattr(schedule.spec, "describe", None)
    what = resolve_object(describe)(cfg, pipeline) if describe else schedule.spec.description
    return f"schedule: {schedule.name} ({what}{tis})"
