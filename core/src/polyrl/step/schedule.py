"""How the trainer turns its steps into pipeline runs: the schedule plugin that
``trainer.async_mode`` selects (:class:`polyrl.specs.ScheduleSpec`).

A schedule owns the order of the work around the pipeline: when a step's batch is drawn and
generated, and which policy generated it. The trainer only says which step to run and when it
validates or checkpoints; it never branches on the mode.

- ``sync`` (:class:`SynchronousSchedule`, core): each step draws its prompts and runs the whole
  pipeline; the samples come from the weights of the previous step's update (on-policy).
- ``one_step_off`` (``polyrl-schedule-offpolicy``): the next step's samples are generated while
  this step trains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from polyrl.step.pipeline import StepPipeline, StepState

if TYPE_CHECKING:
    from polyrl.step.context import StepContext


class StepSchedule(Protocol):
    """``run`` one step (``prefetch_next``: the run goes on past it, or its checkpoint must hold
    the next step's start); ``before_validation`` brings the rollout up to date with the actor;
    ``save``/``load`` the schedule's part of a checkpoint (files in the checkpoint folder, plus a
    JSON-able dict merged into the driver state)."""

    def run(self, step: int, ctx: StepContext, *, prefetch_next: bool) -> StepState: ...

    def before_validation(self, ctx: StepContext) -> None: ...

    def save(self, directory: str) -> dict[str, Any]: ...

    def load(self, directory: str, driver_state: dict[str, Any]) -> None: ...


class SynchronousSchedule:
    """Draw the step's batch, run the pipeline on it: generation, training and weight sync in
    order, so every sample comes from the policy being updated."""

    def __init__(self, cfg: Any, pipeline: StepPipeline) -> None:
        self.pipeline = pipeline

    def run(self, step: int, ctx: StepContext, *, prefetch_next: bool) -> StepState:
        return self.pipeline.run(StepState(step=step, batch=ctx.next_prompts()), ctx)

    def before_validation(self, ctx: StepContext) -> None:
        """Nothing to do: the pipeline's last stage synced the weights."""

    def save(self, directory: str) -> dict[str, Any]:
        return {}

    def load(self, directory: str, driver_state: dict[str, Any]) -> None:
        """Nothing to restore beyond what the trainer restores."""


def describe_sync(cfg: Any, pipeline: StepPipeline) -> str:
    return "generate, train, sync the weights, every step"


def make_schedule(cfg: Any, pipeline: StepPipeline, schedule: Any) -> StepSchedule:
    """The schedule the run plan selected (``schedule``: its registration) for ``pipeline``,
    built by its plugin (a pipeline that cannot run that way raises)."""
    return schedule.load()(cfg, pipeline)
