"""Entry point of polyrl-env-textarena: the ``textarena`` environment and the declaration of
its rows' data source."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import DataSourceScorerSpec, EnvironmentSpec, hookimpl

SETTINGS = "polyrl_env_textarena.settings:TextArenaSettings"


@hookimpl
def polyrl_environments() -> Iterator[EnvironmentSpec]:
    yield EnvironmentSpec(
        name="textarena",
        description="The policy plays a single-player TextArena game per row "
        "(extra_info.env_id, default multi_turn.textarena_env_id); TextArena's final reward "
        "for player 0 is the episode's reward",
        environment="polyrl_env_textarena.environment:TextArenaEnvironment",
        uses_tools=False,
        user_turns=True,
        config_check="polyrl_env_textarena.settings:check_config",
        runtime_modules=("textarena",),
        config_sections={"actor_rollout_ref.rollout.multi_turn": SETTINGS},
    )


@hookimpl
def polyrl_data_source_scorers() -> Iterator[DataSourceScorerSpec]:
    yield DataSourceScorerSpec(
        name="textarena_games",
        description="Declares data_source textarena (rows scored by their game in the "
        "textarena environment); scoring one outside it is an error naming the fix",
        fn="polyrl_env_textarena.scorer:refuse",
        data_sources=("textarena",),
    )
