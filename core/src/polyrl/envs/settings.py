"""``actor_rollout_ref.rollout.multi_turn``: verl's multi-turn keys, and polyrl's own beside them.

Declared by core because the multi-turn rollout is core's (:mod:`polyrl.envs.rollout`); the
section is mounted through the built-in ``policy_gradient`` algorithm's ``config_sections``.
Environment plugins mount their own keys into the same group (the tool environment's
``tool_config_path``). Light on purpose: imported whenever a config is composed.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Tool-call formats the rollout parses from assistant text (:mod:`polyrl.envs.tool_calls`).
TOOL_CALL_FORMATS = ("hermes",)
#: Where an over-long tool response is cut (verl's choices).
TRUNCATE_SIDES = ("left", "right", "middle")


@dataclass
class MultiTurnSettings:
    """verl's keys: ``enable`` turns the rollout into episodes with an environment;
    ``max_assistant_turns`` / ``max_user_turns`` (null: unlimited, the token budget still ends
    the episode) end an episode after that many turns; ``max_parallel_calls`` is how many tool
    calls of one turn run (the rest are answered with an error); ``max_tool_response_length``
    (characters) and ``tool_response_truncate_side`` bound each tool message; ``format`` is the
    tool-call syntax parsed from assistant text.

    polyrl's: ``environment`` names the environment plugin; ``env_timeout_s`` bounds each call of
    an episode's ``start``/``step``/``finish`` (a slow episode ends with ``env_timeout``, the
    others go on); ``max_tokens_per_turn`` (null: what is left of the episode's budget) cuts an
    assistant turn, which the end-of-turn token then closes (not trained on) before the
    environment answers."""

    enable: bool = False
    environment: str = "tools"
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"
    env_timeout_s: float = 60.0
    max_tokens_per_turn: int | None = None
