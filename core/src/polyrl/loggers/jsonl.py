"""``trainer.logger=[jsonl]``: one JSON object per logged step in ``<log_dir>/metrics.jsonl``.

Each line is ``{"step": N, "<metric>": <float or null>, ...}``. The file is the run's durable
record (plots, the end-to-end tests and resume all read it), hence these choices:

* Every line is flushed and fsync'd as it is written: a crash (or a killed job) loses nothing
  that was logged before it. A line cut short by a crash mid-write is dropped when the file is
  next opened.
* NaN and +-inf are written as ``null``: JSON has no spelling for them (Python's ``NaN`` token is
  rejected by strict parsers, ``jq`` and most other languages), and ``null`` reads back as NaN in
  pandas. A null therefore means "not a finite number", never "not measured" (an unmeasured
  metric is simply absent from the line).
* On resume from step N (``ctx.resumed_from_step = N > 0``) the lines with ``step > N`` are
  dropped first (they were logged after the checkpoint the run resumes from and will be logged
  again), by writing a temporary file and renaming it over the old one, so a crash during the
  rewrite leaves either the old or the new file, never a mix.
* A fresh run (``resumed_from_step == 0``) that finds a ``metrics.jsonl`` from an earlier run
  moves it aside to ``metrics.<timestamp>.jsonl`` instead of appending to it or deleting it.

Each ``log()`` call writes one line; the trainer logs once per training step (validation metrics
merged into the step's dict) and, when it validates before training, once at step 0 with those
metrics alone, so steps are unique.

With ``trainer.log_val_generations=N`` each validation's N samples go to
``<log_dir>/val_generations.jsonl`` beside it, one line per sample
(``{"step", "data_source", "prompt", "output", "score"}``), under the same rules (fsync'd,
truncated on resume, an earlier run's file moved aside); the file is created at the first
validation that logs samples.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, TextIO

from polyrl.fsutil import atomic_write_text, fsync_path
from polyrl.interfaces.logger import LoggerContext, MetricsLogger
from polyrl.loggers.values import finite_or_none, to_float_metrics

METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "val_generations.jsonl"

_log = logging.getLogger(__name__)


def metrics_path(log_dir: str) -> str:
    """Where the jsonl logger writes, given the run's ``trainer.default_local_dir``."""
    return os.path.join(log_dir, METRICS_FILE)


def _parse(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        return None
    return record


def truncate_after(path: str, step: int) -> int:
    """Keep only the well-formed lines of ``path`` whose step is ``<= step``; return how many
    lines were dropped. The rewrite goes through a temporary file in the same folder and an
    atomic rename."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    kept: list[str] = []
    for line in lines:
        record = _parse(line)
        if record is not None and record["step"] <= step:
            kept.append(line)
    dropped = len(lines) - len(kept)
    if dropped == 0:
        return 0
    atomic_write_text(path, "".join(line + "\n" for line in kept))
    return dropped


def _drop_partial_last_line(path: str) -> None:
    """A crash mid-write can leave a last line without its newline; cut it off so the next
    record does not get glued to it."""
    with open(path, "rb+") as fh:
        data = fh.read()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())
    _log.warning(
        "%s: dropped an incomplete last line (crash during a write)", os.path.basename(path)
    )


def _move_aside(path: str) -> str:
    """``<name>.jsonl`` -> ``<name>.<timestamp>.jsonl`` (a free name)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(path)))
    base = f"{os.path.splitext(path)[0]}.{stamp}"
    target, n = f"{base}.jsonl", 1
    while os.path.exists(target):
        target, n = f"{base}-{n}.jsonl", n + 1
    os.replace(path, target)
    return target


def prepare_metrics_file(path: str, resumed_from_step: int) -> None:
    """Make ``path`` ready for appending the records of a run that resumes after
    ``resumed_from_step`` (0: a fresh run). See the module docstring for the rules."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if not os.path.exists(path):
        return
    if resumed_from_step > 0:
        _drop_partial_last_line(path)
        dropped = truncate_after(path, resumed_from_step)
        if dropped:
            _log.info(
                "%s: dropped %d lines after step %d (resuming)",
                os.path.basename(path),
                dropped,
                resumed_from_step,
            )
    elif os.path.getsize(path) > 0:
        moved = _move_aside(path)
        _log.warning("%s of an earlier run moved aside to %s", os.path.basename(path), moved)


def encode_record(metrics: dict[str, float], step: int) -> str:
    """One line of the file (without newline): ``step`` first, non-finite values as null."""
    if "step" in metrics:
        raise ValueError(
            "a metric is named 'step', which the jsonl record uses for the step number; rename it"
        )
    record: dict[str, Any] = {"step": int(step)}
    record.update((k, finite_or_none(v)) for k, v in to_float_metrics(metrics).items())
    return json.dumps(record, allow_nan=False, separators=(",", ":"))


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The records of a metrics file, skipping malformed lines (for plots and tests)."""
    with open(path, encoding="utf-8") as fh:
        return [r for r in map(_parse, fh.read().splitlines()) if r is not None]


def _open_for_append(path: str) -> TextIO:
    """``path`` opened for appending; a new file's folder entry is fsync'd too."""
    existed = os.path.exists(path)
    fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held for the run
    if not existed:
        fsync_path(os.path.dirname(os.path.abspath(path)))
    return fh


def _append(fh: TextIO, lines: list[str]) -> None:
    fh.write("".join(line + "\n" for line in lines))
    fh.flush()
    os.fsync(fh.fileno())


class JsonlLogger(MetricsLogger):
    """Appends one fsync'd JSON line per ``log()`` call to ``<ctx.log_dir>/metrics.jsonl``, and
    one per validation sample to ``val_generations.jsonl``."""

    def __init__(self, ctx: LoggerContext) -> None:
        super().__init__(ctx)
        self.path = metrics_path(ctx.log_dir)
        prepare_metrics_file(self.path, ctx.resumed_from_step)
        self.generations_path = os.path.join(ctx.log_dir, GENERATIONS_FILE)
        # now, not at the first samples: a resumed run that validates later must not keep the
        # samples logged after its checkpoint, nor a fresh run append to an earlier run's
        prepare_metrics_file(self.generations_path, ctx.resumed_from_step)
        self._fh = _open_for_append(self.path)
        self._generations: TextIO | None = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._fh.closed:
            raise RuntimeError(f"JsonlLogger for {self.path} was already finished")
        _append(self._fh, [encode_record(metrics, step)])

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        if self._fh.closed:
            raise RuntimeError(f"JsonlLogger for {self.path} was already finished")
        if self._generations is None:
            self._generations = _open_for_append(self.generations_path)
        lines = [
            json.dumps(
                {**row, "step": int(step), "score": finite_or_none(row["score"])},
                allow_nan=False,
                ensure_ascii=False,
            )
            for row in rows
        ]
        _append(self._generations, lines)

    def finish(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        if self._generations is not None and not self._generations.closed:
            self._generations.close()
