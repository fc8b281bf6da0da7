"""A user's verl-style interaction for the tiny digits task (no verl import), loaded by file
path from an interaction config: it plays the user, telling the model the digit to write until
its answer scores 1 (``polyrl/tiny_digits``: per character 1 for the digit, 0.5 for another).

Every episode's final score (``calculate_score``) is appended to ``config["score_log"]`` when the
episode is finalized, so a test can check that the run trained on exactly these scores."""

from __future__ import annotations

import json
from typing import Any

from polyrl.api import default_compute_score


class DigitTeacherInteraction:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.answers: dict[str, tuple[str, str]] = {}  # instance id -> (last answer, digit)

    async def start_interaction(
        self, instance_id: str, ground_truth: str = "", **kwargs: Any
    ) -> str:
        self.answers[instance_id] = ("", str(ground_truth))
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        digit = self.answers[instance_id][1]
        self.answers[instance_id] = (str(messages[-1]["content"]), digit)
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, "Right.", score, {}
        return False, f"Write the digit {digit}:", score, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        answer, digit = self.answers[instance_id]
        score = default_compute_score("polyrl/tiny_digits", answer, digit)
        return float(score["score"] if isinstance(score, dict) else score)

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        score = await self.calculate_score(instance_id)
        with open(self.config["score_log"], "a", encoding="utf-8") as log:
            log.write(json.dumps({"score": score}) + "\n")
        del self.answers[instance_id]
