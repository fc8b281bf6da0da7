"""The tool environment's keys, mounted beside verl's in ``actor_rollout_ref.rollout.multi_turn``.
Light on purpose: imported whenever a config is composed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ToolSettings:
    """``tool_config_path`` (verl's key): a verl tool-config YAML (``tools:`` entries with
    ``class_name``, ``config``, ``tool_schema``); null: no tools. ``tool_timeout_s`` (polyrl's):
    the limit of each tool call; a call past it ends its episode (``tool_timeout``).
    ``max_tool_output_bytes``: what a tool may print per call (the rest is dropped and counted)."""

    tool_config_path: str | None = None
    tool_timeout_s: float = 10.0
    max_tool_output_bytes: int = 65536
