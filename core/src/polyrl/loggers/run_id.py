"""The id of a tracking service's run, kept beside the run's outputs so that a training run
resumed from a checkpoint continues the same tracked run instead of starting a second one
(wandb, mlflow, swanlab loggers)."""

from __future__ import annotations

import logging
import os

from polyrl.checkpoint import atomic_write_text
from polyrl.interfaces.logger import LoggerContext

_log = logging.getLogger(__name__)


def stored_run_id(ctx: LoggerContext, file_name: str) -> str | None:
    """The id stored in ``<log_dir>/<file_name>`` when the training run resumes, else None."""
    path = os.path.join(ctx.log_dir, file_name)
    if ctx.resumed_from_step <= 0:
        return None
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            stored = fh.read().strip()
        if stored:
            return stored
    _log.info("no %s in %s: the resumed run starts a new tracked run", file_name, ctx.log_dir)
    return None


def store_run_id(ctx: LoggerContext, file_name: str, run_id: str) -> None:
    """Keep ``run_id`` in ``<log_dir>/<file_name>`` for a later resume."""
    os.makedirs(ctx.log_dir, exist_ok=True)
    atomic_write_text(os.path.join(ctx.log_dir, file_name), run_id + "\n")


def resumable_run_id(ctx: LoggerContext, file_name: str, new_id: str) -> tuple[str, bool]:
    """``(run_id, resuming)``: the stored id when the training run resumes and one is stored,
    else ``new_id``, which is then stored for a later resume."""
    stored = stored_run_id(ctx, file_name)
    if stored is not None:
        return stored, True
    store_run_id(ctx, file_name, new_id)
    return new_id, False
