"""Entry point of polyrl-algo-reinforce. Light on purpose: no torch import here; the registry
resolves the import strings only when a name is selected."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import ESTIMATOR_KEYS, AdvantageEstimatorSpec, AlgorithmSpec, hookimpl

_ADV = "polyrl_algo_reinforce.advantages"
_STEP = "polyrl.api:policy_gradient_pipeline"
_ROLES = ("actor", "rollout", "ref", "reward_model")


@hookimpl
def polyrl_algorithms() -> Iterator[AlgorithmSpec]:
    yield AlgorithmSpec(
        name="remax",
        description="ReMax: returns minus the reward of the greedy response to the same prompt",
        pipeline="polyrl_algo_reinforce.remax:remax_pipeline",
        estimators=("remax",),
        roles=_ROLES,
    )
    yield AlgorithmSpec(
        name="reinforce_plus_plus",
        description="REINFORCE++: discounted returns whitened over the batch, no critic",
        pipeline=_STEP,
        estimators=("reinforce_plus_plus",),
        roles=_ROLES,
    )
    yield AlgorithmSpec(
        name="reinforce_plus_plus_baseline",
        description="REINFORCE++-baseline: score minus group mean, whitened over the batch",
        pipeline=_STEP,
        estimators=("reinforce_plus_plus_baseline",),
        roles=_ROLES,
    )


@hookimpl
def polyrl_advantage_estimators() -> Iterator[AdvantageEstimatorSpec]:
    yield AdvantageEstimatorSpec(
        name="remax",
        description="ReMax: return-to-go minus reward_baselines (the greedy response's reward)",
        fn=f"{_ADV}:remax_advantage",
        requires=("token_level_rewards", "response_mask", "reward_baselines"),
    )
    yield AdvantageEstimatorSpec(
        name="reinforce_plus_plus",
        description="REINFORCE++: return-to-go discounted by algorithm.gamma, whitened over "
        "the batch",
        fn=f"{_ADV}:reinforce_plus_plus_advantage",
        requires=("token_level_rewards", "response_mask"),
    )
    yield AdvantageEstimatorSpec(
        name="reinforce_plus_plus_baseline",
        description="REINFORCE++-baseline: score - group mean, whitened over the batch",
        fn=f"{_ADV}:reinforce_plus_plus_baseline_advantage",
        requires=ESTIMATOR_KEYS,
        requires_groups=True,
    )
