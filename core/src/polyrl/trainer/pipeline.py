"""The training step as a pipeline of named stages.

A step is ``generate -> reward -> old log-probs -> reference log-probs -> advantages -> actor
update -> weight sync``; each stage reads and extends one :class:`StepState`. Algorithms change the
step by editing the stage list (insert a re-sampling stage after ``reward`` for DAPO's dynamic
sampling, replace ``gen`` for ReMax's extra greedy rollout, add reward shaping before ``adv``)
instead of forking the trainer: see :meth:`StepPipeline.insert_after` and friends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from polyrl.batch import Batch


@dataclass
class StepState:
    """What flows through one step: the growing batch, and the metrics and timings so far."""

    step: int
    batch: Batch
    metrics: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``timing_s/<name>``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timing[name] = self.timing.get(name, 0.0) + time.perf_counter() - start


class Stage(Protocol):
    """One step of the pipeline; ``name`` is also its timing key (``timing_s/<name>``)."""

    name: str

    def run(self, state: StepState) -> None: ...


class StepPipeline:
    """An ordered list of stages with editing operations."""

    def __init__(self, stages: list[Stage]) -> None:
        self.stages = list(stages)

    def names(self) -> list[str]:
        return [stage.name for stage in self.stages]

    def _position(self, name: str) -> int:
        names = self.names()
        if name not in names:
            raise KeyError(f"no stage {name!r} in the pipeline; stages: {names}")
        return names.index(name)

    def insert_after(self, name: str, stage: Stage) -> None:
        self.stages.insert(self._position(name) + 1, stage)

    def insert_before(self, name: str, stage: Stage) -> None:
        self.stages.insert(self._position(name), stage)

    def replace(self, name: str, stage: Stage) -> None:
        self.stages[self._position(name)] = stage

    def remove(self, name: str) -> None:
        del self.stages[self._position(name)]

    def run(self, state: StepState) -> StepState:
        for stage in self.stages:
            with state.timed(stage.name):
                stage.run(state)
        return state
