"""The distillation step: the standard policy-gradient step with a teacher::

    gen -> reward -> old_log_prob -> [ref] -> [kl_in_reward] -> teacher -> adv -> update_actor
        -> update_weights

``teacher`` is the teacher's forward pass over the student's samples; ``adv`` replaces the
estimator's stage: the per-token reverse KL to the teacher (:mod:`polyrl_algo_distill.kl_signal`),
plus the estimator's task advantage when ``distill.task_reward_weight`` is not 0. Reading
``old_log_probs`` here makes the ``old_log_prob`` stage run its forward pass on every step.
"""

from __future__ import annotations

from typing import Any

from polyrl.api import (
    MODEL_INPUT_KEYS,
    Dispatch,
    Stage,
    StepContext,
    StepPipeline,
    StepState,
    policy_gradient_pipeline,
)
from polyrl_algo_distill.settings import configured_teachers

TEACHER = "teacher"
TEACHER_LOG_PROBS = "teacher_log_probs"
STUDENT_KEYS = ("old_log_probs", TEACHER_LOG_PROBS, "response_mask")


def routes_by_data_source(cfg: Any) -> bool:
    """Whether some teacher of ``distill`` is for one data source (the rows' ``data_source``
    then goes to the teacher role)."""
    return any(t.data_source is not None for t in configured_teachers(cfg.distill))


class TeacherLogProbStage(Stage):
    """The teacher's log-probs of the tokens the student sampled, as ``teacher_log_probs``."""

    name = TEACHER
    provides = (TEACHER_LOG_PROBS,)
    roles = (TEACHER,)

    def __init__(self, cfg: Any) -> None:
        routed = ("data_source",) if routes_by_data_source(cfg) else ()
        self.requires = (*MODEL_INPUT_KEYS, *routed)

    def run(self, state: StepState, ctx: StepContext) -> None:
        out = ctx.workers.call(
            TEACHER,
            "compute_log_prob",
            state.batch.select_keys(self.requires),
            dispatch=Dispatch.DP_SPLIT,
        )
        state.batch[TEACHER_LOG_PROBS] = out[TEACHER_LOG_PROBS]


class DistillAdvantageStage(Stage):
    """``advantages`` from the reverse KL to the teacher, plus ``task_reward_weight`` times the
    selected estimator's advantages (its ``requires`` join this stage's only then);
    ``returns`` equal the advantages (no critic reads them)."""

    name = "adv"
    provides = ("advantages", "returns")

    def __init__(self, cfg: Any) -> None:
        self.coef = float(cfg.distill.coef)
        self.task_reward_weight = float(cfg.distill.task_reward_weight)
        self.requires = STUDENT_KEYS
        self.registration: Any = None
        self._estimator: Any = None

    def bind(self, plan: Any) -> None:
        if self.task_reward_weight:
            self.registration = plan.estimator
            extra = tuple(self.registration.spec.requires)
            self.requires = tuple(dict.fromkeys((*STUDENT_KEYS, *extra)))

    def run(self, state: StepState, ctx: StepContext) -> None:
        from polyrl_algo_distill.kl_signal import distill_advantages, signal_metrics

        batch = state.batch
        task = None
        if self.task_reward_weight:
            if self._estimator is None:
                self._estimator = self.registration.load()
            task, _ = self._estimator(batch, ctx.cfg.algorithm)
        student, teacher, mask = (batch[k] for k in STUDENT_KEYS)
        advantages = distill_advantages(
            student, teacher, mask, self.coef, task, self.task_reward_weight
        )
        batch["advantages"], batch["returns"] = advantages, advantages
        state.metrics.update(signal_metrics(student, teacher, mask))


def distill_pipeline(cfg: Any) -> StepPipeline:
    """The step above for the composed config ``cfg``."""
    step = policy_gradient_pipeline(cfg)
    step.insert_before("adv", TeacherLogProbStage(cfg))
    step.replace("adv", DistillAdvantageStage(cfg))
    return step
