"""PPO's step: the standard policy-gradient step with a critic::

    gen -> reward -> old_log_prob -> [ref] -> [kl_in_reward] -> values -> adv -> [pf_ppo]
        -> update_critic -> update_actor -> update_weights

``values`` is the critic's forward pass (GAE reads it), ``update_critic`` regresses the critic on
the returns with the driver's mini-batch planner (``critic.ppo_mini_batch_size`` prompts,
``critic.ppo_epochs``, ``critic.shuffle``). During the critic's warm-up (steps before
``trainer.critic_warmup``) the actor does not update and the rollout keeps its weights, as in
verl.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polyrl.api import (
    MODEL_INPUT_KEYS,
    Dispatch,
    MiniBatchPlan,
    Stage,
    StepContext,
    StepPipeline,
    StepState,
    plan_minibatches,
    policy_gradient_pipeline,
)
from polyrl_algo_ppo.metrics import value_metrics
from polyrl_algo_ppo.pf_ppo import PfPpoStage


def critic_plan(cfg: Any, num_rows: int, dp_size: int, step: int) -> MiniBatchPlan:
    """The critic update's mini-batch plan for this batch (see :mod:`polyrl.step.minibatch`)."""
    critic = cfg.critic
    return plan_minibatches(
        num_rows,
        dp_size,
        int(critic.ppo_mini_batch_size) * int(cfg.actor_rollout_ref.rollout.n),
        epochs=int(critic.ppo_epochs),
        shuffle=bool(critic.shuffle),
        seed=int(cfg.trainer.seed),
        step=step,
    )


class ValuesStage(Stage):
    """The critic's values of the sampled responses, before any update of this step."""

    name = "values"
    requires = MODEL_INPUT_KEYS
    provides = ("values",)
    roles = ("critic",)

    def run(self, state: StepState, ctx: StepContext) -> None:
        out = ctx.workers.call(
            "critic",
            "compute_values",
            state.batch.select_keys(MODEL_INPUT_KEYS),
            dispatch=Dispatch.DP_SPLIT,
        )
        state.batch["values"] = out["values"]


class UpdateCriticStage(Stage):
    """The value model regressed on ``returns`` with the clipped value loss; verl's
    ``critic/*`` metrics of the values the advantages were computed with."""

    name = "update_critic"
    requires = (*MODEL_INPUT_KEYS, "values", "returns")
    roles = ("critic",)

    def run(self, state: StepState, ctx: StepContext) -> None:
        batch = state.batch
        state.metrics.update(value_metrics(batch))
        plan = critic_plan(ctx.cfg, len(batch), ctx.workers.dp_size("critic"), state.step)
        per_rank = ctx.workers.call(
            "critic", "update", batch.select_keys(self.requires), plan, dispatch=Dispatch.DP_SPLIT
        )
        for key in per_rank[0]:
            state.metrics[key] = float(np.mean([m[key] for m in per_rank]))
        state.metrics["critic/optimizer_steps"] = float(plan.optimizer_steps)


class AfterCriticWarmup(Stage):
    """Runs ``stage`` from step ``warmup`` on (verl's ``critic_warmup <= step``): before, the
    critic learns values of a policy that stands still."""

    def __init__(self, stage: Stage, warmup: int) -> None:
        self.stage, self.warmup = stage, warmup
        self.name, self.roles = stage.name, stage.roles
        self.requires, self.provides = stage.requires, stage.provides
        self.recomputes_on_policy = stage.recomputes_on_policy

    def bind(self, plan: Any) -> None:
        """The wrapped stage is bound, and its plan-dependent declarations become this one's."""
        self.stage.bind(plan)
        self.requires, self.provides = self.stage.requires, self.stage.provides

    def link(self, later: Any) -> None:
        self.stage.link(later)

    def run(self, state: StepState, ctx: StepContext) -> None:
        if state.step >= self.warmup:
            self.stage.run(state, ctx)

    def state_dict(self) -> dict[str, Any]:
        return self.stage.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stage.load_state_dict(state)


def ppo_pipeline(cfg: Any) -> StepPipeline:
    """The step above for the composed config ``cfg``."""
    step = policy_gradient_pipeline(cfg)
    step.insert_before("adv", ValuesStage())
    step.insert_after("adv", UpdateCriticStage())
    if cfg.algorithm.use_pf_ppo:  # the critic and the actor learn from the resampled batch
        step.insert_after("adv", PfPpoStage(cfg))
    warmup = int(cfg.trainer.critic_warmup)
    if warmup > 1:
        for name in ("update_actor", "update_weights"):
            step.replace(name, AfterCriticWarmup(step[name], warmup))
    return step
