"""Entry point ``code`` of the group ``polyrl``: registers the code reward's data-source scorers
by import string, so that listing plugins imports nothing of them."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import DataSourceScorerSpec, hookimpl
from polyrl_reward_code.settings import SANDBOX_FUSION_SECTION, SANDBOX_FUSION_SOURCES, SECTION


@hookimpl
def polyrl_data_source_scorers() -> Iterator[DataSourceScorerSpec]:
    yield DataSourceScorerSpec(
        name="code",
        description="A response's Python program run against the row's test cases "
        "(stdin/stdout pairs, assert snippets) in polyrl's sandbox",
        fn="polyrl_reward_code.scorer:score",
        data_sources=("code",),
        settings_key="code",
        config_check="polyrl_reward_code.checks:check_config",
        config_sections={SECTION: "polyrl_reward_code.settings:CodeRewardSettings"},
    )
    yield DataSourceScorerSpec(
        name="sandbox_fusion",
        description="verl's code data sources, each test case run by the SandboxFusion service "
        "at reward_model.sandbox_fusion.url (verl's route and score)",
        fn="polyrl_reward_code.fusion_scorer:score",
        data_sources=SANDBOX_FUSION_SOURCES,
        settings_key="sandbox_fusion",
        config_check="polyrl_reward_code.checks:check_sandbox_fusion",
        config_sections={
            SANDBOX_FUSION_SECTION: "polyrl_reward_code.settings:SandboxFusionSettings"
        },
        implies="polyrl_reward_code.checks:implied_settings",
    )
