"""Entry point of polyrl-env-verifiers: the ``verifiers`` environment."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import EnvironmentSpec, hookimpl

SETTINGS = "polyrl_env_verifiers.settings:VerifiersSettings"


@hookimpl
def polyrl_environments() -> Iterator[EnvironmentSpec]:
    yield EnvironmentSpec(
        name="verifiers",
        description="A verifiers environment (multi_turn.verifiers_env: SingleTurnEnv, "
        "MultiTurnEnv, ToolEnv) drives the turns with its env_response and stop conditions; "
        "its Rubric's score is the episode's reward",
        environment="polyrl_env_verifiers.environment:VerifiersEnvironment",
        uses_tools=True,
        user_turns=True,
        config_check="polyrl_env_verifiers.settings:check_config",
        runtime_modules=("verifiers",),
        config_sections={"actor_rollout_ref.rollout.multi_turn": SETTINGS},
    )
