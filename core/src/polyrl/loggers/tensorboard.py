"""``trainer.logger=[tensorboard]``: scalar event files in ``<log_dir>/tensorboard``.

Uses ``torch.utils.tensorboard.SummaryWriter`` (torch is a core dependency and the trainer has
imported it anyway; tensorboard's own framework-free writer is marked experimental). On resume
from step N the writer is opened with ``purge_step=N + 1``: TensorBoard then hides the events
with step > N that the crashed run wrote after its last checkpoint, so curves do not fold back.
Metric names are used as tags unchanged; their ``/`` groups them into TensorBoard sections.
Validation samples (``trainer.log_val_generations``) are a text table per validation.
"""

from __future__ import annotations

import os
from typing import Any

from polyrl.interfaces.logger import LoggerContext, MetricsLogger
from polyrl.loggers.values import to_float_metrics

TENSORBOARD_SUBDIR = "tensorboard"
GENERATIONS_TAG = "val/generations"


def _cell(text: Any) -> str:
    """``text`` as one Markdown table cell: a ``|`` would end the cell, a newline the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


class TensorboardLogger(MetricsLogger):
    """One scalar per metric and step; flushed every step so a live TensorBoard sees it."""

    def __init__(self, ctx: LoggerContext) -> None:
        super().__init__(ctx)
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.path.join(ctx.log_dir, TENSORBOARD_SUBDIR)
        os.makedirs(self.log_dir, exist_ok=True)
        purge_step = ctx.resumed_from_step + 1 if ctx.resumed_from_step > 0 else None
        self._writer = SummaryWriter(log_dir=self.log_dir, purge_step=purge_step)
        self._closed = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._closed:
            raise RuntimeError(f"TensorboardLogger for {self.log_dir} was already finished")
        for key, value in to_float_metrics(metrics).items():
            self._writer.add_scalar(key, value, global_step=int(step))
        self._writer.flush()

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """The validation samples as one Markdown table under the ``val/generations`` text tag
        (TensorBoard's Text tab renders it, with a step slider)."""
        if self._closed:
            raise RuntimeError(f"TensorboardLogger for {self.log_dir} was already finished")
        lines = ["| score | source | prompt | output |", "|---|---|---|---|"]
        lines += [
            f"| {row['score']:.3f} | {_cell(row['data_source'])} | {_cell(row['prompt'])} | "
            f"{_cell(row['output'])} |"
            for row in rows
        ]
        self._writer.add_text(GENERATIONS_TAG, "\n".join(lines), global_step=int(step))
        self._writer.flush()

    def finish(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.close()
