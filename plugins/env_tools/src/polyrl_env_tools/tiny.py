"""``tool_tiny``: a task the tiny model can only solve with the tool's answer.

The prompt asks for a hidden digit and does not contain it (the row's ``ground_truth``, from
``builtin:tiny_digits`` rows, whose own prompt is replaced). The first assistant turn is answered
by the ``lookup`` tool with the digit; the second turn is the answer, scored by the row's usual
scorer (``polyrl/tiny_digits``: per character 1 for the digit, 0.5 for another digit) through
the reward provider. So reward above the any-digit level needs reading the tool's message.

Why the tool answers the first turn whatever it says: a randomly initialised 2-layer model cannot
learn to write a JSON tool call in the few steps CI allows; what it can learn, and what this
task checks, is that the trajectory holds the tool's tokens in context (attended, masked out of
the loss) and that the policy learns to use them. The ``tools`` environment parses real calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyrl.api import AssistantTurn, Environment, Episode, EpisodeStart, Observation

PROMPT = "What is the secret digit?"


class LookupEpisode(Episode):
    def __init__(self, secret: str) -> None:
        self.secret = secret

    async def start(self) -> EpisodeStart:
        return EpisodeStart(messages=[{"role": "user", "content": PROMPT}])

    async def step(self, turn: AssistantTurn) -> Observation:
        if turn.index == 0:
            answer = {"role": "tool", "content": f"secret {self.secret}", "name": "lookup"}
            return Observation([answer], metrics={"tool_calls": 1.0})
        return Observation(done=True)


class ToolTinyEnvironment(Environment):
    def episode(self, row: Mapping[str, Any]) -> Episode:
        return LookupEpisode(str(row["ground_truth"]))
