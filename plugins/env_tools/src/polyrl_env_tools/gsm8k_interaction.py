"""polyrl's equivalent of verl's ``verl.interactions.gsm8k_interaction.Gsm8kInteraction``,
loaded under that name from an interaction config (verl's own class imports verl).

After each assistant turn it scores the turn's text against the row's ``ground_truth``
(``interaction_kwargs.ground_truth``, as verl's GSM8K preprocessing writes it) with the strict
GSM8K check (the number after the last ``####``; polyrl compares numbers, so ``1,000`` equals
``1000``): a right answer ends the episode with "Your response is correct!", a wrong one asks the
model to reflect and try again. ``calculate_score`` is the score of the last answer seen.
"""

from __future__ import annotations

import uuid
from typing import Any

from polyrl.api import default_compute_score

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction:
    """verl's GSM8K interaction: one state per episode (``instance_id``)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name = str(config.get("name", "gsm8k"))
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any
    ) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
        self._instances[instance_id]["response"] = str(last.get("content") or "")
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, CORRECT, score, {}
        return False, INCORRECT, score, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        state = self._instances[instance_id]
        score = default_compute_score("openai/gsm8k", state["response"], state["ground_truth"])
        return float(score["score"] if isinstance(score, dict) else score)

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
