"""Entry point of polyrl-algo-ppo. Light on purpose: no torch import here; the registry
resolves the import strings only when PPO is selected."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import AdvantageEstimatorSpec, AlgorithmSpec, hookimpl
from polyrl_algo_ppo.settings import CONFIG_SECTIONS


@hookimpl
def polyrl_algorithms() -> Iterator[AlgorithmSpec]:
    yield AlgorithmSpec(
        name="ppo",
        description="PPO with a critic: GAE advantages from a value model trained with the "
        "clipped value loss, PPO-clipped policy loss",
        pipeline="polyrl_algo_ppo.stages:ppo_pipeline",
        estimators=("gae",),
        roles=("actor", "rollout", "ref", "critic", "reward_model"),
        role_classes={"critic": "polyrl_algo_ppo.critic:CriticRole"},
        plugin_keys={"critic.strategy": "training_engine"},
        config_defaults={"algorithm.adv_estimator": "gae"},
        config_check="polyrl_algo_ppo.checks:check_config",
        config_sections=CONFIG_SECTIONS,
        owned_keys=("algorithm.use_pf_ppo", "algorithm.pf_ppo"),
    )


@hookimpl
def polyrl_advantage_estimators() -> Iterator[AdvantageEstimatorSpec]:
    yield AdvantageEstimatorSpec(
        name="gae",
        description="GAE: TD residuals of the critic's values discounted by gamma * lam, "
        "whitened over the batch; returns = advantages + values",
        fn="polyrl_algo_ppo.gae:gae_advantage",
        requires=("token_level_rewards", "values", "response_mask"),
    )
