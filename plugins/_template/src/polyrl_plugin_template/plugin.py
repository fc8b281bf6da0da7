"""The entry-point module: polyrl imports it to list and select the plugin's registrations.

Keep it light. ``polyrl plugins`` imports this module in a process that must not import torch, so
implementations are named by import string ("module:attribute") and loaded only when selected.
"""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import AdvantageEstimatorSpec, RewardProviderSpec, hookimpl


@hookimpl
def polyrl_advantage_estimators() -> Iterator[AdvantageEstimatorSpec]:
    yield AdvantageEstimatorSpec(
        name="template_reinforce",
        description="REINFORCE: outcome score minus the batch-mean score (template plugin)",
        fn="polyrl_plugin_template.estimator:reinforce_batch_baseline",
        requires=("token_level_rewards", "response_mask"),  # no group ids: works with n=1
        config_class="polyrl_plugin_template.settings:ReinforceBaselineSettings",
    )


@hookimpl
def polyrl_reward_providers() -> Iterator[RewardProviderSpec]:
    yield RewardProviderSpec(
        name="template_keyword",
        description="1 if the response contains the ground-truth keyword, minus a length penalty",
        provider="polyrl_plugin_template.reward:KeywordReward",
        config_class="polyrl_plugin_template.settings:KeywordRewardSettings",
    )
