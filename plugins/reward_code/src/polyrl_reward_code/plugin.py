"""Entry point ``code`` of the group ``polyrl``: registers the code reward's data-source scorer
by import string, so that listing plugins imports nothing of it."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import DataSourceScorerSpec, hookimpl
from polyrl_reward_code.settings import SECTION


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
