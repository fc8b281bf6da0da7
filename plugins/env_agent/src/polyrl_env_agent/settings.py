"""The agent environment's keys, mounted beside verl's in ``actor_rollout_ref.rollout.multi_turn``.
Light on purpose: imported whenever a config is composed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AgentSettings:
    """``agent_function``: the user's ``async def rollout(client, row)``, as ``module:function``
    or ``path/to/file.py:function``; it returns the episode's reward (a float, a dict with
    ``reward`` and ``metrics``, or None to have the run's reward provider score the last turn).
    ``agent_timeout_s``: the whole function's wall-time limit per episode (past it the episode
    ends with ``agent_timeout``; each wait between two requests is also bounded by
    ``env_timeout_s``)."""

    agent_function: str | None = None
    agent_timeout_s: float = 300.0
