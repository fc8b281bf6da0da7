"""The agent environment's keys, mounted beside verl's in ``actor_rollout_ref.rollout.multi_turn``.
Light on purpose: imported whenever a config is composed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class AgentSettings:
    """``agent_function``: the user's ``async def rollout(client, row)``, as ``module:function``
    or ``path/to/file.py:function``; it returns the episode's reward (a float, a dict with
    ``reward`` and ``metrics``, or None to have the run's reward provider score the last turn).
    ``agent_timeout_s``: the whole function's wall-time limit per episode (past it the episode
    ends with ``agent_timeout``; each wait between two requests is also bounded by
    ``env_timeout_s``).
    ``agent_max_concurrency``: how many agent functions may run their own code at once (null:
    all of the batch's). A function holds a slot while it computes (its tools, its calls to other
    services) and gives it up while it waits for a completion, so a batch of agents that each call
    a rate-limited service can be kept to that service's limit; the wait for a slot counts
    toward ``env_timeout_s``."""

    agent_function: str | None = None
    agent_timeout_s: float = 300.0
    agent_max_concurrency: int | None = None


def check_config(cfg: Any) -> list[str]:
    """The agent keys' problems, one line each, for ``polyrl validate`` (before Ray starts)."""
    settings = cfg.actor_rollout_ref.rollout.multi_turn
    problems = []
    if not settings.get("agent_function"):
        problems.append(
            "multi_turn.environment=agent needs multi_turn.agent_function=module:function or "
            "path/to/file.py:function (async def rollout(client, row))"
        )
    if not float(settings.agent_timeout_s) > 0:
        problems.append(f"multi_turn.agent_timeout_s={settings.agent_timeout_s} must be > 0")
    limit = settings.agent_max_concurrency
    if limit is not None and int(limit) < 1:
        problems.append(f"multi_turn.agent_max_concurrency={limit} must be >= 1 (null: no limit)")
    if settings.get("interaction_config_path"):
        problems.append(
            "multi_turn.interaction_config_path (verl's interactions) is read by the tools "
            "environment; with multi_turn.environment=agent the agent function speaks as the "
            "user: unset it, or use multi_turn.environment=tools"
        )
    return problems
