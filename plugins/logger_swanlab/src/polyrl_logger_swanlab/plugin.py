"""Entry point ``swanlab`` of the group ``polyrl``: registers the logger by import string, so
that ``polyrl plugins`` lists it without importing swanlab."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import LoggerSpec, hookimpl


@hookimpl
def polyrl_loggers() -> Iterator[LoggerSpec]:
    yield LoggerSpec(
        name="swanlab",
        description="SwanLab run (offline unless told otherwise): metrics, the config, the "
        "reward curve; a resumed training run continues it",
        logger="polyrl_logger_swanlab.logger:SwanlabLogger",
        config_class="polyrl_logger_swanlab.settings:SwanlabSettings",
        config_check="polyrl_logger_swanlab.settings:check_config",
        runtime_modules=("swanlab",),
    )
