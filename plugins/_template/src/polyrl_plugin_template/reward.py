"""A keyword reward with a length penalty.

``score = matched - min(max_penalty, penalty_per_char * max(0, len(response) - max_chars))`` where
``matched`` is 1 when the ground truth appears in the response as a whole word (case-insensitive
unless ``case_sensitive``). It works for any ``data_source``: short-answer tasks whose ground truth
is a word or a number. The penalty teaches the policy to answer within the budget.
"""

from __future__ import annotations

import re

from polyrl.api import RewardContext, RewardProvider, RewardResult, RewardSample, plugin_settings
from polyrl_plugin_template.settings import KeywordRewardSettings

SETTINGS_SECTION = "template_keyword"


class KeywordReward(RewardProvider):
    """Scores each sample on its own; cheap, so it runs in the driver without workers."""

    def __init__(self, ctx: RewardContext) -> None:
        super().__init__(ctx)
        self.settings = plugin_settings(ctx.reward_model, SETTINGS_SECTION, KeywordRewardSettings)

    def score(self, samples: list[RewardSample]) -> list[RewardResult]:
        return [self._score_one(sample) for sample in samples]

    def _score_one(self, sample: RewardSample) -> RewardResult:
        s = self.settings
        keyword = str(sample.ground_truth).strip()
        flags = 0 if s.case_sensitive else re.IGNORECASE
        pattern = rf"(?<!\w){re.escape(keyword)}(?!\w)"
        matched = 1.0 if keyword and re.search(pattern, sample.solution_str, flags) else 0.0
        overflow = max(0, len(sample.solution_str) - s.max_chars)
        penalty = min(s.max_penalty, s.penalty_per_char * overflow)
        return RewardResult(
            score=matched - penalty, extra={"matched": matched, "length_penalty": penalty}
        )
