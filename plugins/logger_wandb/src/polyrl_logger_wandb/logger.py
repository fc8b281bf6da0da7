"""``trainer.logger=[wandb]``: one Weights & Biases run per training run.

Mode (where the data goes), first match wins:

1. the ``WANDB_MODE`` environment variable (wandb's own switch: online, offline, disabled);
2. ``plugins.wandb.mode``;
3. ``online`` when an API key is configured (``WANDB_API_KEY``, or a ``~/.netrc`` / ``$NETRC``
   entry for the wandb host as ``wandb login`` writes it), else ``offline``.

So a machine without credentials (CI, an air-gapped cluster) never blocks on a login prompt or a
network timeout: the run is written under ``<log_dir>/wandb/offline-run-*`` and can be uploaded
later with ``wandb sync``.

Resume: the run id is kept in ``<log_dir>/wandb_run_id.txt``. A training run that resumes from a
checkpoint (``ctx.resumed_from_step > 0``) reuses it with ``resume="allow"``, so its steps
continue the same wandb run instead of starting a second one. A fresh run gets a new id.

Validation samples (``trainer.log_val_generations``) are a ``wandb.Table`` per validation.
"""

from __future__ import annotations

import logging
import netrc
import os
import secrets
import string
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from polyrl.api import LoggerContext, MetricsLogger, resumable_run_id, to_float_metrics
from polyrl_logger_wandb.config import WandbLoggerConfig

RUN_ID_FILE = "wandb_run_id.txt"
DEFAULT_BASE_URL = "https://api.wandb.ai"
GENERATIONS_KEY = "val/generations"
GENERATION_COLUMNS = ("step", "data_source", "prompt", "output", "score")

_log = logging.getLogger(__name__)


def new_run_id() -> str:
    """A fresh run id in wandb's style: 8 characters of lowercase letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def api_key_configured(env: Mapping[str, str] | None = None) -> bool:
    """Whether wandb would find credentials: ``WANDB_API_KEY`` or a netrc entry for its host."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or DEFAULT_BASE_URL).hostname
    path = env.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not host or not os.path.isfile(path):
        return False
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (netrc.NetrcParseError, OSError):
        return False
    return bool(entry and entry[2])


def resolve_mode(config_mode: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The wandb mode to use (see the module docstring for the order)."""
    env = os.environ if env is None else env
    explicit = env.get("WANDB_MODE", "").strip()
    if explicit:
        return explicit
    if config_mode:
        return config_mode
    return "online" if api_key_configured(env) else "offline"


def run_id_for(ctx: LoggerContext, new_id: str) -> tuple[str, bool]:
    """``(run_id, resuming)``: the stored id when the training run resumes, else ``new_id``."""
    return resumable_run_id(ctx, RUN_ID_FILE, new_id)


class WandbLogger(MetricsLogger):
    """Logs every step's metrics to one wandb run (``Run.log(metrics, step=step)``)."""

    def __init__(self, ctx: LoggerContext) -> None:
        super().__init__(ctx)
        import wandb

        options = WandbLoggerConfig.from_run_config(ctx.config or {})
        os.makedirs(ctx.log_dir, exist_ok=True)
        self.mode = resolve_mode(options.mode)
        self.run_id, resuming = run_id_for(ctx, new_run_id())
        self._run: Any = wandb.init(
            project=ctx.project_name,
            name=ctx.experiment_name,
            config=dict(ctx.config or {}),
            dir=ctx.log_dir,
            id=self.run_id,
            resume="allow",
            mode=self.mode,
            entity=options.entity,
            group=options.group,
            tags=options.tags or None,
            notes=options.notes,
        )
        if resuming:
            _log.info("continuing wandb run %s from step %d", self.run_id, ctx.resumed_from_step)
        self._finished = False

    @property
    def run_dir(self) -> str:
        """The local folder of this wandb run (``.../wandb/<offline-run|run>-<time>-<id>``)."""
        return os.path.dirname(self._run.dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._finished:
            raise RuntimeError(f"WandbLogger for run {self.run_id} was already finished")
        self._run.log(to_float_metrics(metrics), step=int(step))

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """The validation samples as a ``wandb.Table`` under ``val/generations`` at ``step``
        (one table per validation; the UI's step slider moves between them)."""
        if self._finished:
            raise RuntimeError(f"WandbLogger for run {self.run_id} was already finished")
        import wandb

        table = wandb.Table(
            columns=list(GENERATION_COLUMNS),
            data=[[row[column] for column in GENERATION_COLUMNS] for row in rows],
        )
        self._run.log({GENERATIONS_KEY: table}, step=int(step))

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._run.finish()
