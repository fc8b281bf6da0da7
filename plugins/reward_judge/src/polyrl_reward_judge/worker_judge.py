"""The ``rollout`` backend's driver side: a step's judge prompts go, as text, to the ``judge``
worker role (:mod:`polyrl_reward_judge.role`), split over its data-parallel ranks."""

from __future__ import annotations

from typing import Any

import numpy as np

from polyrl.api import Batch, Dispatch, RewardError
from polyrl_reward_judge.settings import PROMPT_KEY, REPLY_KEY

JUDGE_ROLE = "judge"


class WorkerJudge:
    """Holds the driver's handle on the workers once the trainer attaches it."""

    def __init__(self) -> None:
        self.workers: Any = None

    def attach_workers(self, workers: Any) -> None:
        self.workers = workers

    def judge(self, prompts: list[str]) -> list[str]:
        """The judge's reply to each prompt, in order. The prompts are padded with copies of
        the last to a multiple of the role's data-parallel size (every rank gets equal rows)."""
        if self.workers is None:
            raise RewardError(
                "the judge role has no workers: reward_model.judge.backend=rollout judges on "
                "the run's workers, which polyrl train starts (outside a run, use backend=openai)"
            )
        extra = -len(prompts) % self.workers.dp_size(JUDGE_ROLE)
        texts = np.array([*prompts, *[prompts[-1]] * extra], dtype=object)
        out = self.workers.call(
            JUDGE_ROLE, "judge", Batch(non_tensors={PROMPT_KEY: texts}), dispatch=Dispatch.DP_SPLIT
        )
        return [str(reply) for reply in out[REPLY_KEY][: len(prompts)]]

    def close(self) -> None:
        """The role's engine closes with its worker."""
