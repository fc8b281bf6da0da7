"""What runs inside a reward worker process: load the scoring function once, then score samples
sent over a pipe until told to stop.

Kept in its own light module (no torch) because every worker imports it at start, and worker
start-up time is paid again each time a hung worker is replaced.
"""

from __future__ import annotations

import functools
import signal
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from polyrl.rewards.custom import ScoreFn, load_custom_function, normalise_score
from polyrl.rewards.sandbox import become_subreaper


@dataclass(frozen=True)
class ScorerRef:
    """A picklable (and JSON-able) reference to the scoring function: the built-in dispatcher
    (``path`` None; ``plugins`` holds the installed plugins' data-source scorers as
    :func:`polyrl.rewards.scorers.plugin_scorer_refs` gives them; ``preload`` the optional
    libraries to import before the first sample, None for all of them) or ``name`` in the file
    ``path``. Workers resolve it themselves: functions defined in a user's file cannot be pickled
    by reference across processes."""

    path: str | None = None
    name: str = "compute_score"
    plugins: dict[str, Any] = field(default_factory=dict)
    preload: tuple[str, ...] | None = None

    def load(self) -> ScoreFn:
        if self.path is None:
            from polyrl.rewards.scorers import default_compute_score, load_plugin_scorers, preload

            preload(self.preload)
            return functools.partial(
                default_compute_score, plugin_scorers=load_plugin_scorers(self.plugins)
            )
        return load_custom_function(self.path, self.name)

    def describe(self) -> str:
        return "built-in scorers" if self.path is None else f"{self.name} from {self.path}"


def describe_exception(exc: BaseException) -> str:
    """``Type: message (at file:line)``: short enough for a log line, enough to find the bug."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {last.filename}:{last.lineno} in {last.name})"
    return text


def score_one(fn: ScoreFn, payload: tuple[str, str, Any, dict[str, Any]]) -> tuple:
    """``("ok", score, extras)`` or ``("err", description)`` for one sample."""
    data_source, solution_str, ground_truth, extra_info = payload
    try:
        score, extras = normalise_score(fn(data_source, solution_str, ground_truth, extra_info))
    except Exception as exc:  # noqa: BLE001 - any failure of user code is reported per sample
        return ("err", describe_exception(exc))
    return ("ok", score, extras)


def worker_main(conn: Connection, scorer: ScorerRef) -> None:
    """Entry point of a worker process. Messages in: ``(task_id, payload)`` or None (stop).
    Messages out: ``("ready",)`` once, then ``(task_id, result)`` per task; ``("fatal", text)``
    if the function cannot be loaded."""
    # Ctrl-C goes to the whole process group; the driver decides what happens to workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    become_subreaper()  # what sandboxed programs leave comes here, to be ended (reap_orphans)
    try:
        fn = scorer.load()
    except Exception as exc:  # noqa: BLE001 - reported to the driver, which raises a clear error
        conn.send(("fatal", describe_exception(exc)))
        return
    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, payload = message
        conn.send((task_id, score_one(fn, payload)))


def sandbox_main(
    path: str | None, name: str, plugins: dict[str, Any], preload: list[str] | None = None
) -> None:
    """Entry point of a sandboxed worker (run by the sandbox's launcher): the same loop as
    :func:`worker_main`, over JSON lines on stdin/stdout instead of a pickling pipe."""
    from polyrl.rewards.sandbox import serve_stdio

    modules = None if preload is None else tuple(preload)
    worker_main(serve_stdio(), ScorerRef(path=path, name=name, plugins=plugins, preload=modules))
