"""One-step off-policy training (``trainer.async_mode=one_step_off``): the samples of step k+1
are generated while step k trains. It is the k-step schedule with k=1
(:mod:`polyrl_schedule_offpolicy.k_step_off`, which explains the versions, the generation
stages and resume); the names below stay importable from here."""

from __future__ import annotations

from typing import Any

from polyrl.api import ConfigError, StepPipeline
from polyrl_schedule_offpolicy.k_step_off import (
    VERSION_KEY,
    KStepOffSchedule,
    StalenessError,
    split_step,
    staleness_metrics,
)
from polyrl_schedule_offpolicy.settings import partial_note

__all__ = [
    "VERSION_KEY",
    "OneStepOffSchedule",
    "StalenessError",
    "describe",
    "split_step",
    "staleness_metrics",
]


class OneStepOffSchedule(KStepOffSchedule):
    """:class:`KStepOffSchedule` with ``max_off_policy_threshold`` 1: a round is one batch."""

    def __init__(self, cfg: Any, pipeline: StepPipeline, strategy: str | None = None) -> None:
        super().__init__(cfg, pipeline, threshold=1, strategy=strategy)


def describe(cfg: Any, pipeline: StepPipeline) -> str:
    """The ``schedule:`` line of ``polyrl validate``: which stages run one step ahead."""
    try:
        generation, training, _ = split_step(pipeline)
    except ConfigError:
        return "this step cannot run ahead"
    ahead = f"{', '.join(generation.names())} run one step ahead of"
    return f"{ahead} {' -> '.join(training.names())}{partial_note(cfg)}"
