"""``trainer.logger=[tensorboard]``: scalar event files in ``<log_dir>/tensorboard``.

Uses ``torch.utils.tensorboard.SummaryWriter`` (torch is a core dependency and the trainer has
imported it anyway; tensorboard's own framework-free writer is marked experimental). On resume
from step N the writer is opened with ``purge_step=N + 1``: TensorBoard then hides the events
with step > N that the crashed run wrote after its last checkpoint, so curves do not fold back.
Metric names are used as tags unchanged; their ``/`` groups them into TensorBoard sections.
"""

from __future__ import annotations

import os

from polyrl.interfaces.logger import LoggerContext, MetricsLogger
from polyrl.loggers.values import to_float_metrics

TENSORBOARD_SUBDIR = "tensorboard"


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

    def finish(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.close()
