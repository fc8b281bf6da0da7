"""Entry point of polyrl-env-agent: the ``agent`` environment."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import EnvironmentSpec, hookimpl


@hookimpl
def polyrl_environments() -> Iterator[EnvironmentSpec]:
    yield EnvironmentSpec(
        name="agent",
        description="The user's agent function (multi_turn.agent_function) drives each episode "
        "with the openai client through /v1/chat/completions served on loopback",
        environment="polyrl_env_agent.environment:AgentEnvironment",
        config_check="polyrl_env_agent.settings:check_config",
        config_sections={
            "actor_rollout_ref.rollout.multi_turn": "polyrl_env_agent.settings:AgentSettings"
        },
    )
