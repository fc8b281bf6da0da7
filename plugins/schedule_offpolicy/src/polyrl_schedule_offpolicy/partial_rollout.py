"""Partial rollouts (``trainer.off_policy.partial_rollout=continue|abort``): the k-step schedule
with the weights synced into the rollout after every update, in the middle of generation.

**How.** A driver thread generates the drawn batches one after the other, each in chunks of
``partial_rollout_chunk_tokens`` new tokens through the rollout engine's ordinary ``generate``
(:mod:`polyrl_schedule_offpolicy.chunks`), and runs the batch's scoring stages when its last
sample is finished. After each update the trainer thread waits for the chunk in progress to end,
syncs the weights (the rollout is idle between chunks) and lets generation go on: under
``continue`` the cut samples go on with the new weights, each token keeping the version that
sampled it (``token_policy_version``; its log-prob is that version's, so the off-policy
correction, TIS or the decoupled loss, is per token); under ``abort`` they start again from
their prompt with the new weights. The wait for the chunk in progress is the price of a sync
(``timing_s/sync_wait``); smaller chunks shorten it and add generate calls. Validation holds
generation the same way, with the rollout at the actor's weights, until the next step.

**Staleness.** The trainer draws the prompts of steps up to s+k at step s. Batch b is trained by
version b-1; the thread starts it only once the rollout holds version b-1-k or later, and the
rollout's version never goes down, so no token of it is more than k versions behind. A sample is
as stale as its oldest token (``policy_version``); both ``async/staleness/*`` (samples) and
``async/token_staleness/*`` (tokens) are logged and checked against k at every step. A batch
staler than k can only come from a checkpoint of a larger k: ``max_off_policy_strategy``
``wait`` generates its prompts again, ``drop`` draws new ones.

**Exactly once and resume.** A checkpoint holds every drawn batch: the finished ones whole, the
others as their prompts (with the uids the samples will have) and the chunks sampled so far. The
resumed run first syncs the actor's weights, then goes on from there: no prompt is drawn twice
or lost, no sample restarts under a new uid. Where a sync falls between chunks depends on how
fast each side runs, so partial rollouts are not reproducible run to run (nor bitwise across a
resume), unlike the other schedules of this package; what each token's version was is recorded.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from polyrl.api import (
    Batch,
    ConfigError,
    PolyrlError,
    StepPipeline,
    StepState,
    derive_seed,
    generate,
    load_step_state,
    names,
    save_step_state,
    training_sampling_params,
)
from polyrl_schedule_offpolicy.chunks import NO_TOKEN, TOKEN_VERSION_KEY, PartialSamples
from polyrl_schedule_offpolicy.k_step_off import (
    BATCH_FILE,
    ONE_STEP_STATE_KEY,
    PROMPTS_FILE,
    STATE_KEY,
    SYNC_STAGE,
    VERSION_KEY,
    StalenessError,
    bounded_staleness,
    split_step,
    staleness_metrics,
)
from polyrl_schedule_offpolicy.settings import PARTIAL_KEY

if TYPE_CHECKING:
    import torch

    from polyrl.api import StepContext

PARTIAL_FILE = "off_policy_partial_{step}.pt"
PARTIAL_META = "partial_rollout"


@dataclass
class InFlight:
    """A drawn batch: its samples chunk by chunk until they are finished, then the scored
    step in ``result``."""

    step: int
    samples: PartialSamples
    result: Future[StepState] = field(default_factory=Future)
    gen_seconds: float = 0.0


def chunkable_problem(generation: StepPipeline) -> str | None:
    """Why the generation stages cannot be generated in chunks, or None: the first one must be
    the single-turn ``gen`` stage (it is replaced by chunks of its engine's ``generate``) and
    the engine must report each token's log-prob."""
    gen = generation.stages[0]
    if gen.name == names.STAGE_GEN and names.ROLLOUT_LOG_PROBS in gen.provides:
        return None
    return (
        f"{PARTIAL_KEY} generates the {names.STAGE_GEN!r} stage's samples in chunks and needs "
        f"the rollout engine's log-prob of every token; this step's first stage is "
        f"{gen.name!r}, providing {list(gen.provides)}: set {PARTIAL_KEY}=off"
    )


def token_staleness_metrics(batch: Batch, actor_version: int, bound: int) -> dict[str, float]:
    """``async/token_staleness/*`` of a batch about to train ``actor_version``; raises
    :class:`StalenessError` when a token is from a later version or more than ``bound``
    versions behind."""
    versions = batch[TOKEN_VERSION_KEY]
    mean, worst = bounded_staleness(versions[versions != NO_TOKEN], actor_version, bound, "tokens")
    return {"async/token_staleness/mean": mean, "async/token_staleness/max": worst}


def oldest_token_versions(token_versions: torch.Tensor) -> torch.Tensor:
    """Each row's oldest token version (a sample is as stale as its stalest token)."""
    import torch

    big = torch.iinfo(token_versions.dtype).max
    oldest = torch.where(token_versions == NO_TOKEN, big, token_versions).min(-1).values
    return torch.where(oldest == big, NO_TOKEN, oldest)


class PartialRolloutSchedule:
    """The schedule above for ``pipeline`` (:class:`polyrl.step.schedule.StepSchedule`), its
    settings from ``trainer.off_policy``; ``threshold`` (k) overrides the section's (the
    one-step mode is k=1)."""

    def __init__(self, cfg: Any, pipeline: StepPipeline, threshold: int | None = None) -> None:
        generation, self.training, self.sync_stage = split_step(pipeline)
        problem = chunkable_problem(generation)
        if problem:
            raise ConfigError(problem)
        self.scoring = StepPipeline(generation.stages[1:], initial_keys=())
        settings = cfg.trainer.off_policy
        self.cfg = cfg
        self.threshold = int(threshold or settings.max_off_policy_threshold)
        self.strategy = str(settings.max_off_policy_strategy)
        self.mode = str(settings.partial_rollout)
        self.chunk_tokens = int(settings.partial_rollout_chunk_tokens)
        self.actor_version = 0
        self.rollout_version: int | None = 0
        self._flight: deque[InFlight] = deque()
        self._last_drawn = 0
        self._cond = threading.Condition()
        self._pause = False
        self._failure: BaseException | None = None
        self._thread: _Generator | None = None

    # ---- the schedule protocol ----------------------------------------------------------------
    def run(self, step: int, ctx: StepContext, *, prefetch_next: bool) -> StepState:
        """Step ``step``: draw the prompts of the steps up to ``step + k``, take this step's
        batch when its samples are finished and scored, train, and sync the new weights into the
        rollout between two chunks."""
        self._start(ctx)
        self._set_pause(False)
        if self.rollout_version != self.actor_version:
            with self._paused():
                self._sync(StepState(step=step, batch=Batch()), ctx)
        last = step + self.threshold if prefetch_next else step
        self._draw(range(self._last_drawn + 1, last + 1), ctx)
        state = self._take(step, ctx)
        state.metrics.update(staleness_metrics(state.batch, self.actor_version, self.threshold))
        if TOKEN_VERSION_KEY in state.batch:  # not in a batch a k-step checkpoint held
            state.metrics.update(
                token_staleness_metrics(state.batch, self.actor_version, self.threshold)
            )
        self.training.run(state, ctx)
        self.actor_version = step
        if prefetch_next:
            start = time.perf_counter()
            with self._paused():
                state.timing["sync_wait"] = time.perf_counter() - start
                self._sync(state, ctx)
        return state

    def before_validation(self, ctx: StepContext) -> None:
        """Hold generation at a chunk boundary and give the rollout the actor's weights, so that
        validation measures the policy just trained, alone on the rollout; the next step lets
        generation go on."""
        self._set_pause(True)  # until the next step
        with self._paused():
            self._sync(StepState(step=self.actor_version, batch=Batch()), ctx)

    def save(self, directory: str) -> dict[str, Any]:
        """Write every drawn batch into ``directory`` (finished ones whole, the others as their
        prompts and the chunks so far), at a chunk boundary."""
        finished, partial = [], []
        with self._paused():
            for flight in self._flight:
                prompts = StepState(step=flight.step, batch=flight.samples.prompts)
                path = os.path.join(directory, PROMPTS_FILE.format(step=flight.step))
                save_step_state(path, prompts)
                if flight.result.done():
                    path = os.path.join(directory, BATCH_FILE.format(step=flight.step))
                    save_step_state(path, flight.result.result())
                    finished.append(flight.step)
                else:
                    samples = flight.samples.prompts.select_rows(np.arange(0))
                    samples.meta = {PARTIAL_META: flight.samples.state_dict()}
                    path = os.path.join(directory, PARTIAL_FILE.format(step=flight.step))
                    save_step_state(path, StepState(step=flight.step, batch=samples))
                    partial.append(flight.step)
        return {
            STATE_KEY: {
                "actor_version": self.actor_version,
                "ahead": finished,
                "partial": partial,
                "last_drawn": self._last_drawn,
            }
        }

    def load(self, directory: str, driver_state: dict[str, Any]) -> None:
        """Restore what :meth:`save` wrote (a k-step checkpoint's batches ahead are finished
        batches); the rollout's weights are not in the checkpoint, so the next step syncs."""
        self._stop()
        saved = driver_state.get(STATE_KEY)
        self.rollout_version, self._failure = None, None
        self._flight = deque()
        if "pending_step" in (driver_state.get(ONE_STEP_STATE_KEY) or {}):
            raise ConfigError(
                f"the checkpoint holds a batch of the one-step schedule's older format; resume "
                f"it with {PARTIAL_KEY}=off"
            )
        if not saved:
            self.actor_version = self._last_drawn = int(driver_state["step"])
            return
        self.actor_version = int(saved["actor_version"])
        partial = set(saved.get("partial", ()))
        for step in sorted([*saved["ahead"], *partial]):
            prompts = load_step_state(os.path.join(directory, PROMPTS_FILE.format(step=step)))
            if step in partial:
                path = os.path.join(directory, PARTIAL_FILE.format(step=step))
                state = load_step_state(path).batch.meta[PARTIAL_META]
                self._flight.append(
                    InFlight(step, PartialSamples.from_state_dict(prompts.batch, state))
                )
            else:
                flight = InFlight(step, PartialSamples.start(prompts.batch, *self._sampling(step)))
                flight.result.set_result(
                    load_step_state(os.path.join(directory, BATCH_FILE.format(step=step)))
                )
                self._flight.append(flight)
        drawn = [int(driver_state["step"]), *(flight.step for flight in self._flight)]
        self._last_drawn = int(saved.get("last_drawn", max(drawn)))

    # ---- the trainer thread's part --------------------------------------------------------------
    def _draw(self, steps: range, ctx: StepContext) -> None:
        """Draw the prompts of ``steps`` (each sample's uid is its prompt's, given now, so that a
        resumed run trains the same samples under the same uids)."""
        for step in steps:
            prompts = _with_uids(ctx.next_prompts())
            flight = InFlight(step, PartialSamples.start(prompts, *self._sampling(step)))
            with self._cond:
                if self._failure is not None:
                    flight.result.set_exception(self._failure)
                self._flight.append(flight)
                self._cond.notify_all()
            self._last_drawn = step

    def _sampling(self, step: int) -> tuple[int, int]:
        params = training_sampling_params(self.cfg, step)
        return int(params.n), int(params.max_new_tokens)

    def _take(self, step: int, ctx: StepContext) -> StepState:
        """This step's batch once generated and scored, or by the strategy its replacement when
        it is staler than the threshold (only a checkpoint of a larger threshold holds one)."""
        if not self._flight or self._flight[0].step != step:
            ahead = [f.step for f in self._flight]
            raise PolyrlError(f"step {step} has no drawn batch (drawn: {ahead})")
        flight = self._flight[0]
        start = time.perf_counter()
        state = flight.result.result()
        waited = time.perf_counter() - start
        oldest = int(state.batch[VERSION_KEY].min())
        if self.actor_version - oldest > self.threshold:
            state = self._replace_stale(flight, ctx, dropped=len(state.batch))
        with self._cond:
            self._flight.popleft()
        state.timing["gen_wait"] = waited
        return state

    def _replace_stale(self, flight: InFlight, ctx: StepContext, dropped: int) -> StepState:
        with self._paused():
            if self.strategy == "drop":
                n, length = flight.samples.n, flight.samples.max_new_tokens
                flight.samples = PartialSamples.start(_with_uids(ctx.next_prompts()), n, length)
            else:
                flight.samples.restart()
            flight.result, flight.gen_seconds = Future(), 0.0
        state = flight.result.result()
        if self.strategy == "drop":
            state.metrics["async/dropped_samples"] = float(dropped)
        return state

    def _sync(self, state: StepState, ctx: StepContext) -> None:
        """Bring the rollout to the actor's weights (generation must be paused); under
        ``abort`` the samples cut by it start again."""
        if self.rollout_version == self.actor_version:
            return
        with state.timed(SYNC_STAGE):
            self.sync_stage.run(state, ctx)
        self.rollout_version = self.actor_version
        if self.mode == "abort":
            for flight in self._flight:
                if not flight.result.done():
                    flight.samples.abort_unfinished()

    @contextmanager
    def _paused(self) -> Iterator[None]:
        """Generation held at a chunk boundary (the rollout idle) for the block."""
        before = self._pause
        self._set_pause(True)
        with self._cond:
            while self._thread is not None and self._thread.busy:
                self._cond.wait()
        try:
            yield
        finally:
            self._set_pause(before)

    def _set_pause(self, pause: bool) -> None:
        with self._cond:
            self._pause = pause
            self._cond.notify_all()

    def _start(self, ctx: StepContext) -> None:
        if self._thread is None or self._thread.ctx is not ctx:
            self._stop()
            self._thread = _Generator(self, ctx)

    def _stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None

    # ---- the generation thread's part -----------------------------------------------------------
    def _next_work(self, generator: _Generator) -> InFlight | None:
        """Wait for a batch the rollout may work on now (none when ``generator`` is stopped):
        the first unfinished one, if the rollout's version is recent enough for it."""
        with self._cond:
            while True:
                if generator.stopped:
                    return None
                flight = next((f for f in self._flight if not f.result.done()), None)
                allowed = (
                    flight is not None
                    and self.rollout_version is not None
                    and self.rollout_version >= flight.step - 1 - self.threshold
                )
                if allowed and not self._pause:
                    generator.busy = True
                    return flight
                self._cond.wait()

    def _work(self, flight: InFlight, ctx: StepContext) -> None:
        """One unit of generation on ``flight``: a chunk, or its scoring once it is finished."""
        start = time.perf_counter()
        samples = flight.samples
        if not samples.complete():
            self._chunk(flight.step, samples, ctx)
            flight.gen_seconds += time.perf_counter() - start
            return
        state = StepState(step=flight.step, batch=samples.assemble(ctx.tokenizer.pad_token_id))
        state.batch[VERSION_KEY] = oldest_token_versions(state.batch[TOKEN_VERSION_KEY])
        state.timing[names.STAGE_GEN] = flight.gen_seconds
        state.metrics.update(_chunk_metrics(samples))
        self.scoring.run(state, ctx)
        flight.result.set_result(state)

    def _chunk(self, step: int, samples: PartialSamples, ctx: StepContext) -> None:
        rows = samples.unfinished()
        budget = samples.budget(self.chunk_tokens)
        base = training_sampling_params(self.cfg, step)
        seed = None if base.seed is None else derive_seed(base.seed, "chunk", samples.chunks)
        params = replace(base, n=1, max_new_tokens=budget, seed=seed)
        prompts = samples.continuation(rows, ctx.tokenizer.pad_token_id)
        dp = ctx.workers.dp_size("rollout")
        filler = -len(rows) % dp  # equal parts per data-parallel rank: repeat the first row
        if filler:
            prompts = Batch.concat([prompts, prompts.select_rows([0] * filler)])
        out = generate(ctx, prompts, params).slice(0, len(rows))
        stop = {ctx.tokenizer.eos_token_id, *params.stop_token_ids} - {None}
        samples.record(rows, out, budget, self._version_now(), stop)

    def _version_now(self) -> int:
        if self.rollout_version is None:
            raise StalenessError("the rollout generated before its weights were synced")
        return self.rollout_version


class _Generator:
    """The daemon thread that runs the schedule's generation (daemon: a generation stuck on a
    dead worker must not keep the process alive after the run fails). A failure fails the
    batch being worked on and every later one: their samples may depend on it."""

    def __init__(self, schedule: PartialRolloutSchedule, ctx: StepContext) -> None:
        self.schedule, self.ctx = schedule, ctx
        self.stopped = self.busy = False
        threading.Thread(target=self._loop, name="polyrl-partial-rollout", daemon=True).start()

    def stop(self) -> None:
        with self.schedule._cond:
            self.stopped = True
            self.busy = False
            self.schedule._cond.notify_all()

    def _loop(self) -> None:
        schedule = self.schedule
        while (flight := schedule._next_work(self)) is not None:
            try:
                schedule._work(flight, self.ctx)
            except BaseException as exc:  # noqa: BLE001 - handed to the thread that takes it
                with schedule._cond:
                    if not self.stopped:
                        schedule._failure = exc
                        for failed in schedule._flight:
                            if not failed.result.done():
                                failed.result.set_exception(exc)
                    self.stopped = True
            finally:
                with schedule._cond:
                    self.busy = False
                    schedule._cond.notify_all()


def _chunk_metrics(samples: PartialSamples) -> dict[str, float]:
    """Chunks, samples whose tokens come from more than one version, samples restarted."""
    return {
        "async/partial/chunks": float(samples.chunks),
        "async/partial/continued_samples": float(sum(len(set(v)) > 1 for v in samples.versions)),
        "async/partial/aborted_samples": float(samples.aborted),
    }


def _with_uids(prompts: Batch) -> Batch:
    """``prompts`` with a fresh ``uid`` per prompt (the group id its ``n`` samples share)."""
    prompts["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
    return prompts
