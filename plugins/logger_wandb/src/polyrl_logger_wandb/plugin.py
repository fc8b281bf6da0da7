"""Entry point ``wandb`` of the group ``polyrl``: registers the logger by import string, so that
``polyrl plugins`` lists it without importing wandb."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import LoggerSpec, hookimpl


@hookimpl
def polyrl_loggers() -> Iterator[LoggerSpec]:
    yield LoggerSpec(
        name="wandb",
        description="Weights & Biases run (offline unless an API key is configured); "
        "a resumed training run continues the same wandb run",
        logger="polyrl_logger_wandb.logger:WandbLogger",
        config_class="polyrl_logger_wandb.config:WandbLoggerConfig",
        runtime_modules=("wandb",),
    )
