"""Entry point ``mlflow`` of the group ``polyrl``: registers the logger by import string, so that
``polyrl plugins`` lists it without importing mlflow."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import LoggerSpec, hookimpl


@hookimpl
def polyrl_loggers() -> Iterator[LoggerSpec]:
    yield LoggerSpec(
        name="mlflow",
        description="MLflow run (a local file store unless a tracking URI is given): metrics, "
        "the config as parameters, the reward curve; a resumed training run continues it",
        logger="polyrl_logger_mlflow.logger:MlflowLogger",
        config_class="polyrl_logger_mlflow.settings:MlflowSettings",
        runtime_modules=("mlflow",),
    )
