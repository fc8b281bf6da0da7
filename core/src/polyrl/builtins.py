"""polyrl's built-in plugins. They register through the same hooks as third-party plugins;
every implementation is named by import string so that listing plugins stays light."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.hookspecs import hookimpl
from polyrl.specs import (
    AlgorithmSpec,
    LoggerSpec,
    PolicyLossSpec,
    RewardProviderSpec,
    ScheduleSpec,
)


@hookimpl
def polyrl_policy_losses() -> Iterator[PolicyLossSpec]:
    yield PolicyLossSpec(
        name="vanilla",
        description="PPO clipped surrogate with separate low/high clip ratios and dual clip",
        fn="polyrl.algorithms.policy_loss:vanilla_policy_loss",
    )


@hookimpl
def polyrl_reward_providers() -> Iterator[RewardProviderSpec]:
    naive = "polyrl.rewards.provider:NaiveRewardProvider"
    yield RewardProviderSpec(
        name="naive",
        description="Verifiable scorers chosen by data_source, or custom_reward_function, "
        "in parallel processes with a per-sample timeout",
        provider=naive,
    )
    # verl's other reward managers that score the same way: their names select naive's scoring
    yield RewardProviderSpec(
        name="prime",
        description="verl's prime reward manager: naive's scoring (parallel processes, a "
        "per-sample timeout)",
        provider=naive,
    )
    yield RewardProviderSpec(
        name="batch",
        description="verl's batch reward manager: custom_reward_function called once per "
        "batch with lists (data_sources, solution_strs, ground_truths, extra_infos)",
        provider="polyrl.rewards.batch:BatchRewardProvider",
    )
    yield RewardProviderSpec(
        name="dapo",
        description="verl's DAPO reward manager: naive's scoring; its overlong punishment is "
        "reward_model.overlong_buffer / reward_kwargs (polyrl-algo-grpo)",
        provider=naive,
    )


@hookimpl
def polyrl_loggers() -> Iterator[LoggerSpec]:
    yield LoggerSpec(
        name="console",
        description="Live progress bar with the step's key figures",
        logger="polyrl.loggers.console:ConsoleLogger",
    )
    yield LoggerSpec(
        name="jsonl",
        description="One JSON object per step in ${trainer.default_local_dir}/metrics.jsonl",
        logger="polyrl.loggers.jsonl:JsonlLogger",
    )
    yield LoggerSpec(
        name="tensorboard",
        description="TensorBoard event files in ${trainer.default_local_dir}/tensorboard",
        logger="polyrl.loggers.tensorboard:TensorboardLogger",
    )


@hookimpl
def polyrl_algorithms() -> Iterator[AlgorithmSpec]:
    yield AlgorithmSpec(
        name="policy_gradient",
        description="The standard policy-gradient step (gen, reward, old log-probs, [ref], "
        "[KL in reward], advantages, actor update, weight sync) for estimators that no "
        "algorithm claims",
        pipeline="polyrl.step.policy_gradient:policy_gradient_pipeline",
        roles=("actor", "rollout", "ref", "reward_model"),
        # the multi-turn rollout is this step's (its gen and reward stages), for every
        # algorithm built on it; mounted whenever polyrl is installed
        config_sections={
            "actor_rollout_ref.rollout.multi_turn": "polyrl.envs.settings:MultiTurnSettings"
        },
    )


@hookimpl
def polyrl_schedules() -> Iterator[ScheduleSpec]:
    yield ScheduleSpec(
        name="sync",
        description="Each step generates with the previous update's weights, then trains on "
        "its samples (on-policy)",
        schedule="polyrl.step.schedule:SynchronousSchedule",
        describe="polyrl.step.schedule:describe_sync",
    )
