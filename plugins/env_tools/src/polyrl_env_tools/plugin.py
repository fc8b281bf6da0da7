"""Entry point of polyrl-env-tools: the ``tools``, ``calculator`` and ``tool_tiny`` environments."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import EnvironmentSpec, hookimpl


@hookimpl
def polyrl_environments() -> Iterator[EnvironmentSpec]:
    yield EnvironmentSpec(
        name="tools",
        description="The model calls Python tools (verl's tool-config YAML, "
        "multi_turn.tool_config_path) until it answers; the answer is scored by the reward, or "
        "verl's interactions (multi_turn.interaction_config_path) answer it as the user",
        environment="polyrl_env_tools.environment:ToolEnvironment",
        user_turns=True,
        config_check="polyrl_env_tools.settings:check_config",
        config_sections={
            "actor_rollout_ref.rollout.multi_turn": "polyrl_env_tools.settings:ToolSettings"
        },
    )
    yield EnvironmentSpec(
        name="calculator",
        description="The tools environment with the built-in calculate tool "
        "(recipe=calc_smollm2: reasoning-gym arithmetic); metrics tool_success, "
        "tool_result_correct",
        environment="polyrl_env_tools.calculator:CalculatorEnvironment",
    )
    yield EnvironmentSpec(
        name="tool_tiny",
        description="The tiny model's tool task: the answer is only in the tool's message",
        environment="polyrl_env_tools.tiny:ToolTinyEnvironment",
        config_check="polyrl_env_tools.settings:check_fixed_task",
    )
