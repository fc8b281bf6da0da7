"""The tool environment's keys, mounted beside verl's in ``actor_rollout_ref.rollout.multi_turn``.
Light on purpose: imported whenever a config is composed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ToolSettings:
    """``tool_config_path`` (verl's key): a verl tool-config YAML (``tools:`` entries with
    ``class_name``, ``config``, ``tool_schema``); null: no tools. ``tool_timeout_s`` (polyrl's):
    the limit of each tool call; a call past it ends its episode (``tool_timeout``).
    ``max_tool_output_bytes``: what a tool may print per call (the rest is dropped and counted).
    ``system_prompt``: a system message put first in every episode (replacing the row's own);
    null: the row's messages as they are. ``prefill``: text every episode's first assistant
    turn starts with, e.g. the opening of a tool call for a model whose chat template ignores
    tools; it is part of the prompt's tokens (read by the model, never sampled nor trained on)
    and is parsed together with what the model writes after it. ``tool_success_reward``
    (``calculator`` environment): a reward of the turn whose call the calculator answered with a
    number, added to the episode's score (shaping; 0: none)."""

    tool_config_path: str | None = None
    interaction_config_path: str | None = None
    tool_timeout_s: float = 10.0
    max_tool_output_bytes: int = 65536
    system_prompt: str | None = None
    prefill: str = ""
    tool_success_reward: float = 0.0


def check_config(cfg: Any) -> list[str]:
    """The interaction config's problems, one line each, for ``polyrl validate`` (before Ray
    starts; the user's classes are located, not run)."""
    from polyrl_env_tools.interactions import check_interaction_config

    path = cfg.actor_rollout_ref.rollout.multi_turn.get("interaction_config_path")
    return check_interaction_config(str(path)) if path else []


def check_fixed_task(cfg: Any) -> list[str]:
    """``tool_tiny`` plays its own task: verl's interactions would be ignored there."""
    if cfg.actor_rollout_ref.rollout.multi_turn.get("interaction_config_path"):
        return [
            "multi_turn.interaction_config_path (verl's interactions) is read by the tools "
            "environment; multi_turn.environment=tool_tiny plays its own task: unset it, or use "
            "multi_turn.environment=tools"
        ]
    return []
