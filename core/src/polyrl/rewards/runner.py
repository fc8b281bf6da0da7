"""Score samples in worker processes with a per-sample timeout, so that a reward function that
raises or hangs never stalls or silently corrupts a run.

Why our own small pool rather than ``multiprocessing.Pool`` / ``ProcessPoolExecutor``: neither can
kill the one worker whose task hangs and carry on; a hung task there blocks the pool for good. Here
each worker has its own pipe; the driver waits on all pipes and process sentinels with the nearest
deadline as timeout, kills a worker whose sample runs past ``timeout_s``, starts a replacement and
goes on. Workers are started once (at construction) and reused for every batch, because process
start-up (imports) is the expensive part on a small machine.

``num_workers=0`` scores in the calling process, each sample in a daemon thread joined with the
timeout: the call still returns on time, but a hung function cannot be killed (its thread is left
behind) — use worker processes for untrusted code. With a sandbox, 0 means one sandboxed worker.

With ``sandbox`` (:class:`~polyrl.rewards.sandbox.SandboxLimits`) each worker runs in the sandbox
(:mod:`polyrl.rewards.sandbox`) and speaks JSON: for scorers that evaluate model output and for
reward code marked untrusted (``reward_model.sandbox``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import threading
import time
import warnings
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any

from polyrl.errors import ConfigError, RewardError
from polyrl.interfaces.reward import RewardResult, RewardSample
from polyrl.rewards._worker import ScorerRef, describe_exception, score_one, worker_main
from polyrl.rewards.sandbox import SandboxedProcess, SandboxLimits

logger = logging.getLogger(__name__)

#: How long a new worker may take to import and load the scoring function.
STARTUP_TIMEOUT_S = 120.0
#: Failures logged one by one per call; the rest are counted in the summary.
MAX_LOGGED_FAILURES = 10


class _Worker:
    """One worker process and the driver's end of its connection: a ``multiprocessing`` child
    (pickle over a pipe; trusted code) or a :class:`SandboxedProcess` (JSON lines)."""

    def __init__(self, process: Any, conn: Any) -> None:
        self.process, self.conn = process, conn
        self.started_at = time.monotonic()
        self.ready = False
        self.task: tuple[int, float] | None = None  # (sample position, deadline)

    @classmethod
    def start(
        cls, ctx: Any, scorer: ScorerRef, number: int, sandbox: SandboxLimits | None
    ) -> _Worker:
        name = f"polyrl-reward-{number}"
        if sandbox is not None:
            process = SandboxedProcess(
                "polyrl.rewards._worker:sandbox_main",
                [scorer.path, scorer.name, scorer.plugins, scorer.preload],
                sandbox,
                name,
            )
            return cls(process, process.conn)
        conn, child = ctx.Pipe(duplex=True)
        process = ctx.Process(target=worker_main, args=(child, scorer), name=name, daemon=True)
        process.start()
        child.close()
        return cls(process, conn)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self, timeout: float = 2.0) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.process.join(timeout=timeout)
        self.kill()


class RewardRunner:
    """Scores lists of :class:`RewardSample` with one scoring function.

    ``on_error``: ``"score"`` reports each failure (logging, a warning, ``RewardResult.error``) and
    gives it ``failure_score``; ``"raise"`` scores the whole batch, then raises
    :class:`polyrl.errors.RewardError` listing the failures.
    """

    def __init__(
        self,
        scorer: ScorerRef,
        *,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        failure_score: float = 0.0,
        on_error: str = "score",
        max_consecutive_timeouts: int = 4,
        start_method: str | None = None,
        sandbox: SandboxLimits | None = None,
    ) -> None:
        if on_error not in ("score", "raise"):
            raise ConfigError(
                f"reward_model.on_error={on_error!r}: use 'score' (failure_score and a report) "
                "or 'raise' (stop the run)"
            )
        if num_workers < 0:
            raise ConfigError(f"reward_model.num_workers={num_workers} must be 0 or more")
        self.scorer = scorer
        # With a sandbox, 0 (score in the driver) becomes one sandboxed child: only a separate
        # process can be sandboxed, and asking for in-process scoring must not lift it.
        self.num_workers = max(1, int(num_workers)) if sandbox is not None else int(num_workers)
        self.timeout_s = float(timeout_s)
        self.failure_score = float(failure_score)
        self.on_error = on_error
        self.max_consecutive_timeouts = int(max_consecutive_timeouts)
        self.sandbox = sandbox
        self._fn = scorer.load() if self.num_workers == 0 else None
        self._ctx = multiprocessing.get_context(start_method or _default_start_method())
        self._workers: list[_Worker] = []
        self._spawned = 0
        self._task_ids = 0
        self.replaced_workers = 0
        for _ in range(self.num_workers):
            self._workers.append(self._new_worker())

    # ---- public --------------------------------------------------------------------------------
    def score(self, samples: Sequence[RewardSample]) -> list[RewardResult]:
        """One result per sample, in order. Returns within about ``timeout_s`` per sample per
        worker even when functions hang."""
        if self.num_workers == 0:
            outcomes = [self._score_in_process(s) for s in samples]
        else:
            outcomes = self._score_in_workers(samples)
        return self._finish(samples, outcomes)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            for worker in self._workers:
                worker.kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
            pass

    @property
    def worker_pids(self) -> list[int | None]:
        return [w.process.pid for w in self._workers]

    # ---- in-process ----------------------------------------------------------------------------
    def _score_in_process(self, sample: RewardSample) -> tuple:
        payload = _payload(sample)
        if self.timeout_s <= 0:
            return score_one(self._fn, payload)
        box: list[tuple] = []
        thread = threading.Thread(
            target=lambda: box.append(score_one(self._fn, payload)),
            name=f"polyrl-reward-sample-{sample.index}",
            daemon=True,
        )
        thread.start()
        thread.join(self.timeout_s)
        if not box:
            return ("err", _timeout_text(self.timeout_s) + " (its thread is left running)")
        return box[0]

    # ---- worker processes ----------------------------------------------------------------------
    def _new_worker(self) -> _Worker:
        self._spawned += 1
        return _Worker.start(self._ctx, self.scorer, self._spawned, self.sandbox)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        position = self._workers.index(worker)
        self._workers[position] = self._new_worker()
        self.replaced_workers += 1

    def _score_in_workers(self, samples: Sequence[RewardSample]) -> list[tuple]:
        try:
            return self._score_loop(samples)
        except BaseException:
            # Leave no worker busy with a task of this call (its late result or timeout would be
            # taken for a sample of the next call): replace the busy ones.
            for worker in list(self._workers):
                if worker.task is not None:
                    self._replace(worker)
            raise

    def _score_loop(self, samples: Sequence[RewardSample]) -> list[tuple]:
        outcomes: list[tuple | None] = [None] * len(samples)
        todo = deque(range(len(samples)))
        ids: dict[int, int] = {}  # task id -> sample position
        timeouts_in_a_row = 0
        while todo or any(w.task is not None for w in self._workers):
            for worker in list(self._workers):
                if worker.ready and worker.task is None and todo:
                    self._dispatch(worker, todo, samples, ids, outcomes)
            busy = [w for w in self._workers if w.task is not None or not w.ready]
            if not busy:
                continue
            now = time.monotonic()
            deadlines = [w.task[1] if w.task else w.started_at + STARTUP_TIMEOUT_S for w in busy]
            waitables: list[Any] = [w.conn for w in busy] + [w.process.sentinel for w in busy]
            nearest = min(deadlines)
            timeout = None if nearest == float("inf") else max(0.0, nearest - now)
            ready = set(wait(waitables, timeout=timeout))
            for worker in busy:
                if (worker.conn in ready or worker.process.sentinel in ready) and self._receive(
                    worker, ids, outcomes
                ):
                    timeouts_in_a_row = 0
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.task is not None and now >= worker.task[1]:
                    position = worker.task[0]
                    outcomes[position] = ("err", _timeout_text(self.timeout_s))
                    self._replace(worker)
                    timeouts_in_a_row += 1
                    if timeouts_in_a_row >= self.max_consecutive_timeouts:
                        # The function hangs on everything: fail the rest now, not one
                        # timeout_s at a time.
                        while todo:
                            outcomes[todo.popleft()] = (
                                "err",
                                f"not scored: {timeouts_in_a_row} samples in a row "
                                f"{_timeout_text(self.timeout_s)} (the reward function seems "
                                f"to hang)",
                            )
                elif not worker.ready and now >= worker.started_at + STARTUP_TIMEOUT_S:
                    self._replace(worker)
                    raise RewardError(
                        f"a reward worker did not start within {STARTUP_TIMEOUT_S:.0f} s "
                        f"(loading {self.scorer.describe()})"
                    )
        return [o if o is not None else ("err", "not scored") for o in outcomes]

    def _dispatch(
        self,
        worker: _Worker,
        todo: deque[int],
        samples: Sequence[RewardSample],
        ids: dict[int, int],
        outcomes: list[tuple | None],
    ) -> None:
        position = todo.popleft()
        self._task_ids += 1
        try:
            worker.conn.send((self._task_ids, _payload(samples[position])))
        except (OSError, ValueError):  # the worker died between tasks: replace it, retry later
            todo.appendleft(position)
            self._replace(worker)
            return
        except Exception as exc:  # noqa: BLE001 - e.g. an extra_info that cannot be sent
            outcomes[position] = (
                "err",
                "could not send the sample to a worker: " + (describe_exception(exc)),
            )
            return
        ids[self._task_ids] = position
        deadline = time.monotonic() + self.timeout_s if self.timeout_s > 0 else float("inf")
        worker.task = (position, deadline)

    def _receive(self, worker: _Worker, ids: dict[int, int], outcomes: list[tuple | None]) -> bool:
        """Handle one message of ``worker``; True when it was a sample's result."""
        try:
            if not worker.conn.poll():
                raise EOFError
            message = worker.conn.recv()
        except (EOFError, OSError):
            worker.process.join(timeout=1)
            code = worker.process.exitcode
            if not worker.ready:
                self._replace(worker)
                raise RewardError(
                    f"a reward worker exited (code {code}) while loading "
                    f"{self.scorer.describe()}, before scoring anything"
                ) from None
            if worker.task is not None:
                outcomes[worker.task[0]] = (
                    "err",
                    f"the reward worker process died (exit code {code}) while scoring",
                )
            self._replace(worker)
            return False
        if message[0] == "ready":
            worker.ready = True
            return False
        if message[0] == "fatal":
            self._replace(worker)
            raise RewardError(
                f"a reward worker could not load {self.scorer.describe()}: {message[1]}"
            )
        task_id, result = message
        position = ids.pop(task_id, None)
        if position is not None:
            outcomes[position] = result
        worker.task = None
        return True

    # ---- results -------------------------------------------------------------------------------
    def _finish(self, samples: Sequence[RewardSample], outcomes: list[tuple]) -> list[RewardResult]:
        results: list[RewardResult] = []
        failures: list[str] = []
        for sample, outcome in zip(samples, outcomes):
            if outcome[0] == "ok":
                results.append(RewardResult(score=outcome[1], extra=dict(outcome[2])))
                continue
            error = outcome[1]
            text = f"sample {sample.index} (data_source {sample.data_source!r}): {error}"
            if len(failures) < MAX_LOGGED_FAILURES:
                logger.warning("reward function failed on %s", text)
            failures.append(text)
            results.append(RewardResult(score=self.failure_score, error=error))
        if failures:
            summary = (
                f"reward scoring failed for {len(failures)} of {len(samples)} samples "
                f"({self.scorer.describe()}); first: {failures[0]}"
            )
            if self.on_error == "raise":
                listed = "\n  ".join(failures[:MAX_LOGGED_FAILURES])
                raise RewardError(
                    f"{summary}\n  {listed}\nSet reward_model.on_error=score to give failed "
                    f"samples reward_model.failure_score ({self.failure_score}) instead."
                )
            warnings.warn(
                f"{summary}; scored {self.failure_score} (reward_model.failure_score)",
                RuntimeWarning,
                stacklevel=3,
            )
        return results


def _payload(sample: RewardSample) -> tuple[str, str, Any, dict[str, Any]]:
    return (sample.data_source, sample.solution_str, sample.ground_truth, sample.extra_info or {})


def _timeout_text(timeout_s: float) -> str:
    return f"timed out after {timeout_s:g}s"


def _default_start_method() -> str:
    """``forkserver`` where available: children fork from a small clean server process, which
    is cheap and safe even when the driver has threads (torch, Ray); else ``spawn``."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
