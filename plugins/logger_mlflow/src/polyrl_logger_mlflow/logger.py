"""``trainer.logger=[mlflow]``: one MLflow run per training run, through ``MlflowClient`` (no
process-global active run, so a notebook's own mlflow state is left alone). Validation samples
(``trainer.log_val_generations``) are a JSON-lines artifact per validation."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from polyrl.api import LoggerContext, MetricsLogger, plugin_settings, store_run_id, stored_run_id
from polyrl_logger_mlflow.settings import MlflowSettings

RUN_ID_FILE = "mlflow_run_id.txt"
LOCAL_STORE = "mlruns"
# MLflow's limits: parameters per log_batch call, and characters of one parameter's value.
PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE = 6000
# Characters MLflow refuses in a metric name; verl's "reward/mean@4" becomes "reward/mean_at_4".
_REFUSED = re.compile(r"[^A-Za-z0-9_\-. :/]")


def metric_name(key: str) -> str:
    """``key`` in the characters MLflow accepts (``@`` written as ``_at_``, others as ``_``)."""
    return _REFUSED.sub("_", key.replace("@", "_at_"))


def tracking_uri(settings: MlflowSettings, log_dir: str) -> str:
    """Where the run goes (see the package README for the order). The local default is a file
    store, which MLflow 3 accepts only with ``MLFLOW_ALLOW_FILE_STORE``: set for it alone."""
    if settings.tracking_uri:
        return str(settings.tracking_uri)
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return "file:" + os.path.abspath(os.path.join(log_dir, LOCAL_STORE))


def flat_params(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """The nested config as MLflow parameters: dotted keys, values as text within MLflow's
    length limit."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, name + ".")
        else:
            yield name, str(value)[:MAX_PARAM_VALUE]


class MlflowLogger(MetricsLogger):
    """Every step's metrics to one MLflow run; the reward curve as an artifact."""

    def __init__(self, ctx: LoggerContext) -> None:
        super().__init__(ctx)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        settings = plugin_settings(ctx.config or {}, "mlflow", MlflowSettings)
        self.uri = tracking_uri(settings, ctx.log_dir)
        self.client = MlflowClient(tracking_uri=self.uri)
        name = str(settings.experiment_name or ctx.project_name)
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(name)
        )
        stored = stored_run_id(ctx, RUN_ID_FILE)
        if stored is not None:
            self.run_id = stored
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {str(k): str(v) for k, v in settings.tags.items()}
            run = self.client.create_run(experiment_id, run_name=ctx.experiment_name, tags=tags)
            self.run_id = run.info.run_id
            store_run_id(ctx, RUN_ID_FILE, self.run_id)
            params = [Param(k, v) for k, v in flat_params(ctx.config or {})]
            for start in range(0, len(params), PARAMS_PER_BATCH):
                self.client.log_batch(self.run_id, params=params[start : start + PARAMS_PER_BATCH])
        self._finished = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(metric_name(k), float(v), now, int(step)) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_image(self, name: str, path: str, step: int) -> None:
        self.client.log_artifact(self.run_id, path, artifact_path="images")

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """The validation samples as a JSON-lines artifact,
        ``val_generations/step_<step>.jsonl`` (MLflow has no table of text per step)."""
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        self.client.log_text(self.run_id, text, f"val_generations/step_{int(step):08d}.jsonl")

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.client.set_terminated(self.run_id)
