"""The entry-point module: polyrl imports it to list and select the plugin's registrations.

Keep it light. ``polyrl plugins`` imports this module in a process that must not import torch, so
implementations are named by import string ("module:attribute") and loaded only when selected.
Each spec declares the range of ``polyrl.api.API_VERSION`` the plugin was written for: outside
it, ``polyrl plugins`` lists the registration as incompatible and selecting it fails at once.
"""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import AdvantageEstimatorSpec, RewardProviderSpec, hookimpl

# The polyrl API this plugin uses (PEP 440): every 1.x adds names only, 2.0 may remove one.
API_RANGE = ">=1.0,<2"


@hookimpl
def polyrl_advantage_estimators() -> Iterator[AdvantageEstimatorSpec]:
    yield AdvantageEstimatorSpec(
        name="template_reinforce",
        description="REINFORCE: outcome score minus the batch-mean score (template plugin)",
        fn="polyrl_plugin_template.estimator:reinforce_batch_baseline",
        requires=("token_level_rewards", "response_mask"),  # no group ids: works with n=1
        config_class="polyrl_plugin_template.settings:ReinforceBaselineSettings",
        api_version=API_RANGE,
    )


@hookimpl
def polyrl_reward_providers() -> Iterator[RewardProviderSpec]:
    yield RewardProviderSpec(
        name="template_keyword",
        description="1 if the response contains the ground-truth keyword, minus a length penalty",
        provider="polyrl_plugin_template.reward:KeywordReward",
        config_class="polyrl_plugin_template.settings:KeywordRewardSettings",
        api_version=API_RANGE,
    )
