"""Entry point of polyrl-env-textarena: the ``textarena`` environment."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import EnvironmentSpec, hookimpl

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
