"""The interface a metrics logger implements (console, jsonl, tensorboard, wandb ...)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoggerContext:
    """``log_dir`` is ``trainer.default_local_dir``; ``config`` the whole resolved config as a dict;
    ``total_steps`` lets progress displays show how far the run is."""

    project_name: str
    experiment_name: str
    log_dir: str
    total_steps: int
    config: dict[str, Any] = field(default_factory=dict)
    resumed_from_step: int = 0


class MetricsLogger(ABC):
    """Receives one dict of scalar metrics per training step (and per validation)."""

    def __init__(self, ctx: LoggerContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` for ``step``."""

    def log_image(self, name: str, path: str, step: int) -> None:
        """Record the image file at ``path`` under ``name`` (the run's reward curve, once at the
        end, at the last step). Loggers that keep only scalars ignore it."""

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """Record validation samples (``trainer.log_val_generations``): each row has ``step``,
        ``data_source``, ``prompt`` and ``output`` (text) and ``score`` (float), the same
        prompts at every validation of a run. Optional: loggers that keep only scalars ignore
        it, and the trainer skips a logger class that lacks the method."""

    def finish(self) -> None:
        """Flush and close at the end of the run (also after a crash)."""
