"""``calculator``: the ``tools`` environment with the built-in ``calculate`` tool, for
``recipe=calc_smollm2`` (SmolLM2-135M-Instruct on reasoning-gym's ``basic_arithmetic``).

Every episode may call ``calculate`` (arithmetic evaluated by walking its syntax tree, nothing
executed: :func:`polyrl_env_tools.builtin_tools.calculate`); the last assistant turn is the
answer, scored by the row's reasoning-gym scorer through the reward provider. Two numbers per
episode go to the step's metrics (``multi_turn/<name>/mean``, the share of episodes):

- ``tool_success``: a call parsed and the calculator returned a number;
- ``tool_result_correct``: a number it returned is the row's answer (the call's expression was
  the question's).

``multi_turn.tool_success_reward`` (default 0) rewards a turn whose call returned a number
(:attr:`polyrl.api.Observation.reward`, on that turn's last token; the reward stage adds it to
the answer's score): shaping for a model that seldom ends a call cleanly at first. The answer's
reward (the data's scorer) is unchanged, and the evaluator
(:mod:`polyrl_env_tools.evaluate`) reports it alone.

The keys that shape the prompt are the ``tools`` environment's (``multi_turn.system_prompt``,
``multi_turn.prefill``): SmolLM2's chat template does not show tools, so the recipe describes
the tool in the system prompt and starts the first assistant turn with the opening of a call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polyrl.api import AssistantTurn, EnvironmentContext, Episode, EpisodeResult, Observation
from polyrl_env_tools.builtin_tools import CALCULATE_SCHEMA, calculate
from polyrl_env_tools.environment import ToolEnvironment, ToolEpisode
from polyrl_env_tools.tools import Tool, function_tool


def calculator_tool() -> Tool:
    """The ``calculate`` tool as a tool of an environment."""
    return function_tool(calculate, CALCULATE_SCHEMA)


def as_number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


class CalculatorEpisode(ToolEpisode):
    env: CalculatorEnvironment

    def __init__(self, env: CalculatorEnvironment, row: Mapping[str, Any]) -> None:
        super().__init__(env, row)
        self.success = False
        self.correct = False

    async def step(self, turn: AssistantTurn) -> Observation:
        obs = await super().step(turn)
        truth = as_number(str(self.row.get("ground_truth", "")))
        answered = False
        for message in obs.messages:
            if message.get("name") != "calculate":
                continue
            value = as_number(str(message.get("content", "")))
            if value is not None:
                answered = True
                self.correct |= truth is not None and value == truth
        self.success |= answered
        if answered and self.env.success_reward:
            obs.reward = self.env.success_reward
        return obs

    async def finish(self, reason: str) -> EpisodeResult:
        result = await super().finish(reason)
        result.metrics["tool_success"] = float(self.success)
        result.metrics["tool_result_correct"] = float(self.correct)
        return result


class CalculatorEnvironment(ToolEnvironment):
    """The ``tools`` environment whose only tool is ``calculate`` (unless ``tools`` are given)."""

    def __init__(self, ctx: EnvironmentContext, tools: Sequence[Tool] | None = None) -> None:
        super().__init__(ctx, tools=[calculator_tool()] if tools is None else tools)
        multi_turn = ctx.config.actor_rollout_ref.rollout.multi_turn
        self.success_reward = float(multi_turn.get("tool_success_reward") or 0.0)

    def episode(self, row: Mapping[str, Any]) -> Episode:
        return CalculatorEpisode(self, row)
