"""k-step off-policy training (``trainer.async_mode=k_step_off``): the rollout generates up to
k batches ahead of the step that trains on them, each sample at most k policy versions behind
(k: ``trainer.off_policy.max_off_policy_threshold``; ``one_step_off`` is k=1).

With the rollout on workers of its own (split placement), generation and the actor's update run
at the same time. The rollout works in **rounds**: when the trainer takes the last batch
generated ahead (the buffer is empty), it brings the rollout up to the actor's weights (the
pipeline's ``update_weights`` stage, moved from the end of the step to here), draws the
prompts of the next k steps and has a driver thread generate their batches one after the
other, while this thread trains. The first step generates its own batch first.

**Versions.** Version v is the actor after v updates: step s trains version s-1 into version s.
A round launched at step s (the rollout then holds version s-1) generates the batches of steps
s+1 .. s+k, trained by versions s .. s+k-1: staleness 1 .. k. Every row carries its generating
version in ``policy_version``; staleness is logged per step (``async/staleness/{mean,max}``)
and a batch from a later version raises :class:`StalenessError`. Which version generates
which batch depends only on the step numbers, never on timing, so a run is reproducible and
resumes bitwise.

**Why rounds, not a sync every step.** A weight sync needs the rollout idle. Syncing after
every update would drain the rollout every step, so each batch would have to be generated
within one training step, as in one-step mode; a round gives its k batches k training steps
together, so a slow batch (a long-tailed response length) is absorbed by the fast ones before
it. The price is staleness up to k and, when generation is the faster side, an idle rollout
until the round ends.

**A batch staler than k** can only come from a checkpoint written under a larger threshold.
``max_off_policy_strategy=wait`` generates its prompts again with the current weights (every
prompt still trains once per epoch); ``drop`` leaves them out of the epoch and draws new ones
(``async/dropped_samples``).

**Generation stages** are the leading stages of the pipeline that call no role but the rollout:
``gen``, and scoring stages that run on its output (``reward``, ReMax's greedy baseline, DAPO's
dynamic sampling). They all run ahead, in the background, in the order a synchronous run draws
prompts. A step whose generation is not of this shape is refused by :func:`split_step`.

**Resume.** A checkpoint holds every batch generated ahead (waiting for those in flight; their
versions are gone from the checkpoint) with its prompts; the loader's state already counts
their prompts, the stages' state (a reward stage's failure history) their scoring. The resumed
run trains on exactly those samples, and the trainer prefetches at a last step that writes a
checkpoint, so that a run extended later continues as an uninterrupted one would. A round may
reach past the run's last step: those batches are generated and kept only by a checkpoint.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from polyrl.api import (
    Batch,
    ConfigError,
    PolyrlError,
    Stage,
    StepPipeline,
    StepState,
    load_step_state,
    save_step_state,
)
from polyrl_schedule_offpolicy.settings import (
    PARTIAL_KEY,
    SECTION,
    OffPolicySettings,
    partial_note,
)

if TYPE_CHECKING:
    import torch

    from polyrl.api import StepContext

SYNC_STAGE = "update_weights"
GENERATION_ROLES = frozenset({"rollout"})
VERSION_KEY = "policy_version"
STATE_KEY = "off_policy"
BATCH_FILE = "off_policy_step_{step}.pt"
PROMPTS_FILE = "off_policy_prompts_{step}.pt"
# What the one-step schedule wrote before it became k-step with k=1: one batch ahead.
ONE_STEP_STATE_KEY = "one_step_off"
ONE_STEP_FILE = "one_step_off_batch.pt"


class StalenessError(PolyrlError):
    """A step was about to train on samples of a version the schedule cannot account for."""


def split_step(pipeline: StepPipeline) -> tuple[StepPipeline, StepPipeline, Stage]:
    """``(generation, training, weight sync)``: the leading stages that call only the rollout,
    the rest without the sync stage, and the sync stage. Raises :class:`ConfigError` (one line)
    for a step that cannot run off-policy."""
    stages, names = pipeline.stages, " -> ".join(pipeline.names())
    count = 0
    while count < len(stages) and set(stages[count].roles) <= GENERATION_ROLES:
        count += 1
    generation, rest = stages[:count], stages[count:]
    if not any("rollout" in stage.roles for stage in stages if stage.name != SYNC_STAGE):
        raise ConfigError(
            f"the selected algorithm's step does not generate (no stage calls the rollout role; "
            f"stages: {names}), so there is no generation to overlap with training; use "
            f"trainer.async_mode=sync"
        )
    late = [s.name for s in rest if "rollout" in s.roles and s.name != SYNC_STAGE]
    if late:
        raise ConfigError(
            f"stage(s) {late} call the rollout "
            f"after the step has started training at stage {rest[0].name!r} (stages: {names}); "
            f"only the stages before the first training stage can run ahead; use "
            f"trainer.async_mode=sync"
        )
    syncs = [stage for stage in rest if stage.name == SYNC_STAGE]
    if not syncs:
        raise ConfigError(
            f"the step has no {SYNC_STAGE!r} stage (stages: {names}), so the rollout would never "
            f"receive the actor's new weights and its samples would fall ever further behind"
        )
    training = [stage for stage in rest if stage.name != SYNC_STAGE]
    return (
        StepPipeline(generation, initial_keys=pipeline.initial_keys),
        StepPipeline(training, initial_keys=()),
        syncs[0],
    )


def in_order_in_background(jobs: Sequence[Callable[[], Any]], name: str) -> list[Future[Any]]:
    """Run ``jobs`` one after the other in a daemon thread; each one's result or exception in
    its future (after a failure the later jobs fail with it: their input may depend on the
    rollout's state). Daemon: a generation stuck on a dead worker must not keep the process
    alive after the run fails."""
    futures: list[Future[Any]] = [Future() for _ in jobs]

    def target() -> None:
        failure: BaseException | None = None
        for job, future in zip(jobs, futures, strict=True):
            future.set_running_or_notify_cancel()
            if failure is not None:
                future.set_exception(failure)
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - handed to the thread that takes it
                failure = exc
                future.set_exception(exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    return futures


def staleness_metrics(batch: Batch, actor_version: int, bound: int) -> dict[str, float]:
    """``async/*`` metrics of a batch about to train ``actor_version``; raises
    :class:`StalenessError` when a row is from a later version or more than ``bound``
    versions behind."""
    mean, worst = bounded_staleness(batch[VERSION_KEY], actor_version, bound, "samples")
    return {
        "async/staleness/mean": mean,
        "async/staleness/max": worst,
        "async/policy_version": float(actor_version),
    }


def bounded_staleness(
    versions: torch.Tensor, actor_version: int, bound: int, what: str
) -> tuple[float, float]:
    """Mean and largest staleness of ``what`` (samples, tokens) of policy ``versions`` about to
    train ``actor_version``; :class:`StalenessError` when one is from a later version or more
    than ``bound`` versions behind."""
    staleness = actor_version - versions
    if int(staleness.min()) < 0 or int(staleness.max()) > bound:
        raise StalenessError(
            f"the actor at policy version {actor_version} was about to train on {what} of "
            f"version(s) {sorted(set(versions.tolist()))}; {SECTION}.max_off_policy_threshold="
            f"{bound} allows 0 to {bound} versions behind (report this: the schedule lost track "
            f"of the weights)"
        )
    return float(staleness.double().mean()), float(staleness.max())


def copy_rows(batch: Batch) -> Batch:
    """The rows of ``batch`` as a batch of their own (generation extends the batch it gets)."""
    return batch.select_rows(np.arange(len(batch)))


@dataclass
class Ahead:
    """A step's batch generated (or being generated) ahead, with the prompts it started from."""

    step: int
    prompts: Batch
    result: Future[StepState]


class KStepOffSchedule:
    """The schedule above (:class:`polyrl.step.schedule.StepSchedule`) for ``pipeline``.

    ``threshold`` (k) and ``strategy`` come from ``trainer.off_policy`` unless given (a test
    without a config gets the section's defaults)."""

    def __init__(
        self,
        cfg: Any,
        pipeline: StepPipeline,
        threshold: int | None = None,
        strategy: str | None = None,
    ) -> None:
        self.generation, self.training, self.sync_stage = split_step(pipeline)
        settings = cfg.trainer.off_policy if cfg is not None else OffPolicySettings()
        self.threshold = int(threshold or settings.max_off_policy_threshold)
        self.strategy = str(strategy or settings.max_off_policy_strategy)
        self.actor_version = 0
        # The version the rollout's weights are at; None when unknown (after a resume), which
        # forces a sync before it generates. Both roles load the same model at the start.
        self.rollout_version: int | None = 0
        self._ahead: deque[Ahead] = deque()

    def run(self, step: int, ctx: StepContext, *, prefetch_next: bool) -> StepState:
        """Step ``step``: take its batch (generated ahead, or now), launch the next round when
        the buffer is empty (and ``prefetch_next``), train."""
        if self._ahead:
            ahead = self._ahead.popleft()
            start = time.perf_counter()
            state = ahead.result.result()
            state.timing["gen_wait"] = time.perf_counter() - start
            if ahead.step != step:
                raise PolyrlError(f"the batch generated ahead is for step {ahead.step}, not {step}")
            state = self._within_bound(state, ahead.prompts, ctx)
        else:
            state = self._generate_now(StepState(step=step, batch=ctx.next_prompts()), ctx)
        if prefetch_next and not self._ahead:
            self._sync(state, ctx)
            self._launch(range(step + 1, step + 1 + self.threshold), ctx)
        state.metrics.update(staleness_metrics(state.batch, self.actor_version, self.threshold))
        self.training.run(state, ctx)
        self.actor_version = step
        return state

    def before_validation(self, ctx: StepContext) -> None:
        """Let the generation in flight finish, then give the rollout the actor's weights, so
        validation measures the policy just trained (the sync's metrics belong to no step)."""
        self._drain()
        self._sync(StepState(step=self.actor_version, batch=Batch()), ctx)

    def save(self, directory: str) -> dict[str, Any]:
        """Write every batch generated ahead (waiting for those in flight) and its prompts into
        ``directory``; the versions and the steps written."""
        for ahead in self._ahead:
            save_step_state(os.path.join(directory, BATCH_FILE.format(step=ahead.step)),
                            ahead.result.result())  # fmt: skip
            prompts = StepState(step=ahead.step, batch=ahead.prompts)
            save_step_state(os.path.join(directory, PROMPTS_FILE.format(step=ahead.step)), prompts)
        steps = [ahead.step for ahead in self._ahead]
        return {STATE_KEY: {"actor_version": self.actor_version, "ahead": steps}}

    def load(self, directory: str, driver_state: dict[str, Any]) -> None:
        """Restore what :meth:`save` wrote (or the one-step schedule's single batch ahead); a
        checkpoint of a synchronous run (resumed with ``trainer.resume_allow_changes``) has no
        batch ahead: the next step generates its own."""
        self.rollout_version = None  # the checkpoint holds the actor's weights, not the rollout's
        self._ahead = deque()
        saved, one_step = driver_state.get(STATE_KEY), driver_state.get(ONE_STEP_STATE_KEY)
        if saved:
            if saved.get("partial"):
                raise ConfigError(
                    f"the checkpoint holds samples generated in part (it was written with "
                    f"{PARTIAL_KEY}=continue or abort); resume with that setting"
                )
            self.actor_version = int(saved["actor_version"])
            for step in saved["ahead"]:
                batch = load_step_state(os.path.join(directory, BATCH_FILE.format(step=step)))
                prompts = load_step_state(os.path.join(directory, PROMPTS_FILE.format(step=step)))
                self._ahead.append(Ahead(step, prompts.batch, _done(batch)))
        elif one_step:
            self.actor_version = int(one_step["actor_version"])
            if "pending_step" in one_step:
                batch = load_step_state(os.path.join(directory, ONE_STEP_FILE))
                self._ahead.append(Ahead(batch.step, Batch(), _done(batch)))
        else:
            self.actor_version = int(driver_state["step"])

    # ---- the parts of a step ------------------------------------------------------------------
    def _within_bound(self, state: StepState, prompts: Batch, ctx: StepContext) -> StepState:
        """``state``, or by the strategy a replacement when it is staler than the threshold."""
        staleness = self.actor_version - int(state.batch[VERSION_KEY].min())
        if staleness <= self.threshold:
            return state
        if self.strategy == "wait" and not len(prompts):
            raise StalenessError(
                f"the batch of step {state.step} (from a one-step checkpoint) is {staleness} "
                f"versions behind and its prompts were not saved; resume with "
                f"{SECTION}.max_off_policy_threshold>={staleness}"
            )
        self._drain()  # the rollout must be idle to take new weights
        fresh = copy_rows(prompts) if self.strategy == "wait" else ctx.next_prompts()
        replacement = self._generate_now(StepState(step=state.step, batch=fresh), ctx)
        replacement.timing["gen_wait"] = state.timing.get("gen_wait", 0.0)
        if self.strategy == "drop":
            replacement.metrics["async/dropped_samples"] = float(len(state.batch))
        return replacement

    def _drain(self) -> None:
        for ahead in self._ahead:
            ahead.result.result()

    def _sync(self, state: StepState, ctx: StepContext) -> None:
        if self.rollout_version == self.actor_version:
            return
        with state.timed(SYNC_STAGE):
            self.sync_stage.run(state, ctx)
        self.rollout_version = self.actor_version

    def _generate_now(self, state: StepState, ctx: StepContext) -> StepState:
        self._sync(state, ctx)
        return self._generate(state, ctx, self._synced_version())

    def _synced_version(self) -> int:
        """The rollout's version, which a sync has just made the actor's."""
        if self.rollout_version != self.actor_version or self.rollout_version is None:
            raise StalenessError(
                f"the rollout (version {self.rollout_version}) was about to generate without "
                f"the actor's weights (version {self.actor_version})"
            )
        return self.rollout_version

    def _generate(self, state: StepState, ctx: StepContext, version: int) -> StepState:
        import torch

        self.generation.run(state, ctx)
        state.batch[VERSION_KEY] = torch.full((len(state.batch),), version, dtype=torch.long)
        return state

    def _launch(self, steps: range, ctx: StepContext) -> None:
        version = self._synced_version()
        states = [StepState(step=step, batch=ctx.next_prompts()) for step in steps]
        prompts = [copy_rows(state.batch) for state in states]

        def job(state: StepState) -> Callable[[], StepState]:
            return lambda: self._generate(state, ctx, version)

        results = in_order_in_background(
            [job(state) for state in states], name=f"polyrl-generate-steps-{steps.start}-"
        )
        self._ahead.extend(map(Ahead, steps, prompts, results))


def _done(state: StepState) -> Future[StepState]:
    future: Future[StepState] = Future()
    future.set_result(state)
    return future


def describe(cfg: Any, pipeline: StepPipeline) -> str:
    """The ``schedule:`` line of ``polyrl validate``: which stages run how far ahead."""
    try:
        generation, training, _ = split_step(pipeline)
    except ConfigError:
        return "this step cannot run ahead"
    k = int(cfg.trainer.off_policy.max_off_policy_threshold)
    return (
        f"{', '.join(generation.names())} run up to {k} step(s) ahead of "
        f"{' -> '.join(training.names())} (samples at most {k} version(s) behind)"
        f"{partial_note(cfg)}"
    )
