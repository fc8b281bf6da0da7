"""A worker group without Ray: plain objects, one per rank, called in threads of this process.

Same interface and failure semantics as :class:`~polyrl.workers.worker_group.WorkerGroup`
(dispatch, rank-ordered outputs, the first failing rank raises at once, timeouts name the
pending ranks). The trainer's in-process backend (``trainer.worker_backend=in_process``) hosts
each pool's one worker with it; unit tests of dispatch, roles and failure handling use it with
several ranks (which share one process, so they cannot join one torch.distributed group).

The threads are daemons: a rank that never returns (blocked on purpose in a test) does not keep
the interpreter alive.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from polyrl.workers.group import SPMDGroup, WorkerError


class LocalWorkerGroup(SPMDGroup):
    """``world_size`` instances of ``worker_cls(rank=r, world_size=n, **init_kwargs)``."""

    def __init__(
        self,
        worker_cls: Callable[..., Any],
        *,
        world_size: int,
        init_kwargs: dict[str, Any] | None = None,
        name: str = "local",
        ready_timeout_s: float | None = 60.0,
    ) -> None:
        self.name, self.world_size = name, world_size
        # The threads of the last call: one a signal interrupted (the caller stopped waiting)
        # may still be running a step when the workers are shut down.
        self._threads: list[threading.Thread] = []
        kwargs = dict(init_kwargs or {})
        self.workers: list[Any] = self._in_threads(
            [
                (lambda rank=rank: worker_cls(rank=rank, world_size=world_size, **kwargs))
                for rank in range(world_size)
            ],
            "start",
            ready_timeout_s,
        )

    def _run(
        self,
        method: str,
        per_rank_args: Sequence[tuple[Any, ...]],
        *,
        what: str | None,
        timeout_s: float | None,
    ) -> list[Any]:
        calls = [
            (lambda worker=worker, args=args: getattr(worker, method)(*args))
            for worker, args in zip(self.workers, per_rank_args)
        ]
        return self._in_threads(calls, what or method, timeout_s)

    def _in_threads(
        self, calls: Sequence[Callable[[], Any]], what: str, timeout_s: float | None
    ) -> list[Any]:
        done: queue.Queue[tuple[int, bool, Any]] = queue.Queue()

        def runner(rank: int, fn: Callable[[], Any]) -> None:
            try:
                done.put((rank, True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises
                done.put((rank, False, exc))

        self._threads = [
            threading.Thread(
                target=runner, args=(rank, fn), daemon=True, name=f"polyrl-{self.name}-{rank}"
            )
            for rank, fn in enumerate(calls)
        ]
        for thread in self._threads:
            thread.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        results: dict[int, Any] = {}
        while len(results) < len(calls):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                rank, ok, value = done.get(timeout=remaining)
            except queue.Empty:
                pending = [r for r in range(len(calls)) if r not in results]
                raise WorkerError(
                    f"worker call {what!r} in pool {self.name!r} did not finish within "
                    f"{timeout_s} s on ranks {pending}"
                ) from None
            if not ok:
                raise WorkerError(
                    f"{self._describe(rank)} failed in {what!r}: {type(value).__name__}: {value}"
                ) from value
            results[rank] = value
        return [results[rank] for rank in range(len(calls))]

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Call each worker's ``shutdown()`` when it has one, once the last call's threads have
        ended (within ``timeout_s``: a step that a signal interrupted the caller's wait for runs
        on, and leaving its process group under it aborted the interpreter at exit); errors and
        stuck ranks are ignored (the objects are dropped either way)."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if all(hasattr(worker, "shutdown") for worker in self.workers):
            with contextlib.suppress(WorkerError):
                self.run("shutdown", [()] * self.world_size, timeout_s=timeout_s)
        self.workers = []
