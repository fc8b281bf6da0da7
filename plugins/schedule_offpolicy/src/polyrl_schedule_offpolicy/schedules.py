"""What ``trainer.async_mode=one_step_off|k_step_off`` build: rounds of whole batches
(:mod:`~polyrl_schedule_offpolicy.k_step_off`), or partial rollouts
(:mod:`~polyrl_schedule_offpolicy.partial_rollout`) when ``trainer.off_policy.partial_rollout``
is ``continue`` or ``abort``."""

from __future__ import annotations

from typing import Any

from polyrl.api import StepPipeline


def k_step_off(cfg: Any, pipeline: StepPipeline) -> Any:
    if _partial(cfg):
        from polyrl_schedule_offpolicy.partial_rollout import PartialRolloutSchedule

        return PartialRolloutSchedule(cfg, pipeline)
    from polyrl_schedule_offpolicy.k_step_off import KStepOffSchedule

    return KStepOffSchedule(cfg, pipeline)


def one_step_off(cfg: Any, pipeline: StepPipeline) -> Any:
    if _partial(cfg):
        from polyrl_schedule_offpolicy.partial_rollout import PartialRolloutSchedule

        return PartialRolloutSchedule(cfg, pipeline, threshold=1)
    from polyrl_schedule_offpolicy.one_step_off import OneStepOffSchedule

    return OneStepOffSchedule(cfg, pipeline)


def _partial(cfg: Any) -> bool:
    return str(cfg.trainer.off_policy.partial_rollout) != "off"
