"""``trainer.logger=[swanlab]``: one SwanLab run per training run (see the package README)."""

from __future__ import annotations

import os
import secrets
import string
from typing import Any

from polyrl.api import LoggerContext, MetricsLogger, plugin_settings, resumable_run_id
from polyrl_logger_swanlab.settings import SwanlabSettings

RUN_ID_FILE = "swanlab_run_id.txt"
LOG_FOLDER = "swanlog"


def resolve_mode(settings: SwanlabSettings) -> str:
    return os.environ.get("SWANLAB_MODE") or settings.mode or "offline"


def new_run_id() -> str:
    """A fresh id in SwanLab's style: lowercase letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(21))


class SwanlabLogger(MetricsLogger):
    """Every step's metrics to one SwanLab run; the reward curve as an image."""

    def __init__(self, ctx: LoggerContext) -> None:
        super().__init__(ctx)
        import swanlab

        settings = plugin_settings(ctx.config or {}, "swanlab", SwanlabSettings)
        self.mode = resolve_mode(settings)
        self.log_dir = os.path.join(ctx.log_dir, LOG_FOLDER)
        os.makedirs(self.log_dir, exist_ok=True)
        self.run_id, resuming = resumable_run_id(ctx, RUN_ID_FILE, new_run_id())
        self._swanlab = swanlab
        self._run: Any = swanlab.init(
            project=ctx.project_name,
            name=ctx.experiment_name,
            config=dict(ctx.config or {}),
            log_dir=self.log_dir,
            mode=self.mode,
            id=self.run_id,
            resume="allow" if resuming else "never",
            workspace=settings.workspace,
            tags=list(settings.tags) or None,
            description=settings.description,
            reinit=True,
        )
        self._finished = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=int(step))

    def log_image(self, name: str, path: str, step: int) -> None:
        self._run.log({name: self._swanlab.Image(path)}, step=int(step))

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._run.finish()
