"""The hook specifications a polyrl plugin implements.

A plugin is a module listed under the entry-point group ``polyrl`` in its package metadata::

    [project.entry-points.polyrl]
    mysandbox = "polyrl_reward_mysandbox.plugin"

That module defines functions decorated with :data:`hookimpl` whose names match the specs
below. Each hook returns an iterable of registration dataclasses of one kind (see
:mod:`polyrl.specs`). Keep the module light: import heavy libraries inside the implementation
(or name it with an import string), never at the top of the entry-point module.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from polyrl.specs import (
    AdvantageEstimatorSpec,
    AlgorithmSpec,
    DataSourceScorerSpec,
    EnvironmentSpec,
    LoggerSpec,
    PolicyLossSpec,
    RewardProviderSpec,
    RolloutEngineSpec,
    ScheduleSpec,
    TrainingEngineSpec,
)

PROJECT_NAME = "polyrl"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def polyrl_training_engines() -> Iterable[TrainingEngineSpec]:
    """Register training engines, selected by ``actor_rollout_ref.actor.strategy=<name>``.

    Example::

        from polyrl import hookimpl
        from polyrl.specs import TrainingEngineSpec

        @hookimpl
        def polyrl_training_engines():
            yield TrainingEngineSpec(
                name="myengine",
                description="My data-parallel trainer",
                engine="polyrl_engine_mine.engine:MyEngine",  # a polyrl.interfaces.TrainingEngine
                supports_cpu=True,
            )
    """


@hookspec
def polyrl_rollout_engines() -> Iterable[RolloutEngineSpec]:
    """Register rollout (generation) engines, selected by ``actor_rollout_ref.rollout.name=<name>``.

    Example::

        from polyrl import hookimpl
        from polyrl.specs import RolloutEngineSpec

        @hookimpl
        def polyrl_rollout_engines():
            yield RolloutEngineSpec(
                name="mygen",
                description="Sampling with my inference server",
                engine="polyrl_rollout_mine.engine:MyRollout",  # a polyrl.interfaces.RolloutEngine
                supports_cpu=True,
                supports_sleep=False,
            )
    """


@hookspec
def polyrl_advantage_estimators() -> Iterable[AdvantageEstimatorSpec]:
    """Register advantage estimators, selected by ``algorithm.adv_estimator=<name>``.

    The callable follows :data:`polyrl.interfaces.AdvantageEstimatorFn`.

    Example::

        import torch
        from polyrl import hookimpl
        from polyrl.specs import AdvantageEstimatorSpec

        def sign_advantage(batch, config):
            mask = batch["response_mask"]
            score = (batch["token_level_rewards"] * mask).sum(-1)
            adv = torch.sign(score).unsqueeze(-1) * mask
            return adv, adv

        @hookimpl
        def polyrl_advantage_estimators():
            yield AdvantageEstimatorSpec(
                name="sign",
                description="+1/-1 by the outcome sign",
                fn=sign_advantage,
                requires=("token_level_rewards", "response_mask"),  # the keys it reads
            )
    """


@hookspec
def polyrl_policy_losses() -> Iterable[PolicyLossSpec]:
    """Register policy losses, selected by ``actor_rollout_ref.actor.policy_loss.loss_mode=<name>``.

    The callable follows :data:`polyrl.interfaces.PolicyLossFn`: it returns a per-token loss
    matrix and metrics; the trainer aggregates the matrix with ``loss_agg_mode``.

    Example::

        from polyrl import hookimpl
        from polyrl.specs import PolicyLossSpec

        def reinforce(batch, log_prob, config):
            return -batch["advantages"] * log_prob * batch["response_mask"], {}

        @hookimpl
        def polyrl_policy_losses():
            yield PolicyLossSpec(
                name="reinforce",
                description="-A * log pi",
                fn=reinforce,
                requires=("advantages", "response_mask"),  # the keys it reads
            )
    """


@hookspec
def polyrl_reward_providers() -> Iterable[RewardProviderSpec]:
    """Register reward providers, selected by ``reward_model.reward_manager=<name>``.

    Example::

        from polyrl import hookimpl
        from polyrl.interfaces import RewardProvider, RewardResult
        from polyrl.specs import RewardProviderSpec

        class LengthPenalty(RewardProvider):
            def score(self, samples):
                return [RewardResult(score=-len(s.solution_str) / 1000) for s in samples]

        @hookimpl
        def polyrl_reward_providers():
            yield RewardProviderSpec(
                name="length", description="Shorter is better", provider=LengthPenalty
            )
    """


@hookspec
def polyrl_loggers() -> Iterable[LoggerSpec]:
    """Register metrics loggers, selected by ``trainer.logger=[<name>, ...]``.

    Example::

        from polyrl import hookimpl
        from polyrl.interfaces import MetricsLogger
        from polyrl.specs import LoggerSpec

        class PrintLogger(MetricsLogger):
            def log(self, metrics, step):
                print(step, metrics)

        @hookimpl
        def polyrl_loggers():
            yield LoggerSpec(name="print", description="print() every step", logger=PrintLogger)
    """


@hookspec
def polyrl_algorithms() -> Iterable[AlgorithmSpec]:
    """Register RL algorithms: the stages of the training step and the config they bring.

    ``algorithm.adv_estimator=<one of estimators>`` selects the algorithm that owns that
    estimator; ``algorithm.name=<name>`` selects one explicitly. The pipeline function gets the
    composed config and returns a :class:`polyrl.step.StepPipeline`; start from the standard
    policy-gradient step and edit it, or build your own list of stages. Each stage declares the
    batch keys it requires and provides; ``polyrl validate`` checks the chain.

    Example (GRPO's step with an extra stage that adds a metric)::

        from polyrl import hookimpl
        from polyrl.specs import AlgorithmSpec
        from polyrl.step import Stage, policy_gradient_pipeline

        class ResponseLengthBonus(Stage):
            name = "length_bonus"
            requires = ("token_level_rewards", "response_mask")
            provides = ("token_level_rewards",)

            def run(self, state, ctx):
                lengths = state.batch["response_mask"].sum(-1)
                state.metrics["length_bonus/mean_length"] = float(lengths.float().mean())

        def pipeline(cfg):
            steps = policy_gradient_pipeline(cfg)
            steps.insert_after("reward", ResponseLengthBonus())
            return steps

        @hookimpl
        def polyrl_algorithms():
            yield AlgorithmSpec(
                name="grpo_length",
                description="GRPO with a response-length metric",
                pipeline=pipeline,
                config_defaults={"algorithm.adv_estimator": "grpo"},
            )
    """


@hookspec
def polyrl_data_source_scorers() -> Iterable[DataSourceScorerSpec]:
    """Register scorers for rows by their ``data_source``, used by the ``naive`` reward provider
    (the default) whenever the package is installed. A reward worker imports ``fn`` itself, so
    name it by import string (or define it at module level).

    Example::

        from polyrl.api import DataSourceScorerSpec, hookimpl

        def palindrome(data_source, solution_str, ground_truth, extra_info, settings):
            text = solution_str.strip().lower()
            return float(len(text) >= settings.get("min_length", 3) and text == text[::-1])

        @hookimpl
        def polyrl_data_source_scorers():
            yield DataSourceScorerSpec(
                name="palindrome",
                description="1.0 for a palindrome response",
                fn=palindrome,
                data_sources=("palindrome",),
            )
    """


@hookspec
def polyrl_schedules() -> Iterable[ScheduleSpec]:
    """Register step schedules, selected by ``trainer.async_mode=<name>``: how the trainer runs
    each step's pipeline (core's ``sync``: generate, train, sync the weights, in order;
    ``polyrl-schedule-offpolicy``'s ``one_step_off``: the next batch is generated while this one
    trains).

    Example::

        from polyrl.api import ScheduleSpec, StepState, hookimpl

        class LoggingSchedule:
            def __init__(self, cfg, pipeline):
                self.pipeline = pipeline

            def run(self, step, ctx, *, prefetch_next):
                print("step", step)
                return self.pipeline.run(StepState(step=step, batch=ctx.next_prompts()), ctx)

            def before_validation(self, ctx): ...
            def save(self, directory): return {}
            def load(self, directory, driver_state): ...

        @hookimpl
        def polyrl_schedules():
            yield ScheduleSpec(name="logging", description="sync, printing each step",
                               schedule=LoggingSchedule)
    """


@hookspec
def polyrl_environments() -> Iterable[EnvironmentSpec]:
    """Register multi-turn environments, selected by
    ``actor_rollout_ref.rollout.multi_turn.environment=<name>`` (with ``multi_turn.enable=true``).
    The contract (episodes, turns, observations, rewards) is :mod:`polyrl.envs.episode`.

    Example::

        from polyrl.api import (Environment, EnvironmentSpec, Episode, EpisodeResult,
                                EpisodeStart, Observation, hookimpl)

        class GuessEpisode(Episode):
            def __init__(self, row):
                self.secret = str(row["ground_truth"])

            async def start(self):
                return EpisodeStart()  # the row's prompt as the data loader tokenized it

            async def step(self, turn):
                if self.secret in turn.text:
                    return Observation(done=True)
                return Observation([{"role": "user", "content": "No, try again."}])

            async def finish(self, reason):
                return EpisodeResult(reward=float(reason == "done"))

        class Guess(Environment):
            def episode(self, row):
                return GuessEpisode(row)

        @hookimpl
        def polyrl_environments():
            yield EnvironmentSpec(name="guess", description="Guess the number, told no until right",
                                  environment=Guess, uses_tools=False, user_turns=True)
    """


HOOK_NAMES = (
    "polyrl_training_engines",
    "polyrl_rollout_engines",
    "polyrl_advantage_estimators",
    "polyrl_policy_losses",
    "polyrl_reward_providers",
    "polyrl_loggers",
    "polyrl_algorithms",
    "polyrl_data_source_scorers",
    "polyrl_schedules",
    "polyrl_environments",
)
