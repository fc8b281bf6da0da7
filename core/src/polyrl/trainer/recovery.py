"""Automatic recovery (``trainer.max_restarts``): which failures a restart can cure, and the
record of each restart.

Only a worker that is gone (killed, out of memory, its node lost) is worth a restart: the
same checkpoint on fresh workers then trains on exactly as before. An exception raised by the
code inside a live worker would be raised again on the same data, so it ends the run as before.
When one rank dies, its peers may report their broken collective first, so a Python error from
a worker still counts as a death when a worker of the group no longer answers a ping.

A worker lost while the workers first start (before any step) is cured the same way: every
worker is started again, and it counts as a restart that lost no step.

Each restart is one line on stderr, one line in ``<run folder>/restarts.jsonl`` (its cause, the
step that was running, the checkpoint step it went back to and the finished steps that had to be
trained again), and ``recovery/restarts`` / ``recovery/steps_lost`` in the metrics of the first
step trained after it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from polyrl.fsutil import fsync_path

RESTARTS_FILE = "restarts.jsonl"
PING_TIMEOUT_S = 10.0


def _ray_exceptions() -> Any:
    import ray.exceptions

    return ray.exceptions


def _cause_is_death(exc: BaseException) -> bool:
    """Ray reports a gone worker as a system error of its own (not a wrapped Python error)."""
    rex = _ray_exceptions()
    cause = exc.__cause__
    return isinstance(cause, rex.RayError) and not isinstance(cause, rex.RayTaskError)


def _group_has_dead_worker(group: Any) -> bool:
    """Ping every actor of a Ray worker group; a dead one raises at once (a busy one only
    times out, and counts as alive)."""
    import ray

    rex = _ray_exceptions()
    for actor in getattr(group, "workers", ()):
        try:
            ray.get(actor.ready.remote(), timeout=PING_TIMEOUT_S)
        except rex.GetTimeoutError:
            continue
        except rex.RayError:
            return True
    return False


def worker_died(exc: BaseException, workers: Any | None) -> bool:
    """Whether the :class:`~polyrl.workers.group.WorkerError` ``exc`` means a worker of
    ``workers`` (a :class:`~polyrl.workers.placement.RoleWorkers`; None while they start, when
    only the error itself can tell) is gone."""
    if _cause_is_death(exc):
        return True
    groups = workers.groups.values() if workers is not None else ()
    return any(_group_has_dead_worker(group) for group in groups)


def cause_line(exc: BaseException) -> str:
    """The first line of a worker error: what a restart records as its cause."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


@dataclass
class Restart:
    """One restart: ``number`` of the run's, after ``cause`` stopped the run at ``failed_step``
    with ``finished_steps`` trained; it went back to the checkpoint of ``resumed_step``."""

    number: int
    cause: str
    failed_step: int
    finished_steps: int
    resumed_step: int = -1  # set once the workers are back

    @property
    def steps_lost(self) -> int:
        """Finished steps that are trained again (those after the checkpoint it went back to)."""
        return max(0, self.finished_steps - self.resumed_step)

    def line(self, max_restarts: int) -> str:
        if self.failed_step == 0 and self.resumed_step == 0 and self.finished_steps == 0:
            return (
                f"polyrl: restart {self.number} of at most {max_restarts} after a worker was "
                f"lost while the workers started; starting them again. Cause: {self.cause}"
            )
        return (
            f"polyrl: restart {self.number} of at most {max_restarts} after a worker was lost in "
            f"step {self.failed_step}; resuming from step {self.resumed_step} "
            f"({self.steps_lost} finished step(s) to train again). Cause: {self.cause}"
        )

    def metrics(self) -> dict[str, float]:
        return {
            "recovery/restarts": float(self.number),
            "recovery/steps_lost": float(self.steps_lost),
        }


def record_restart(output_dir: str, restart: Restart) -> None:
    """Append ``restart`` to ``<output_dir>/restarts.jsonl`` (flushed and fsync'd: the record
    must survive the crash of the run that made it)."""
    path = os.path.join(output_dir, RESTARTS_FILE)
    entry = {"time": time.time(), **asdict(restart), "steps_lost": restart.steps_lost}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    fsync_path(output_dir)
