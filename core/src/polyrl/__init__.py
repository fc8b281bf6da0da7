"""polyrl: RL post-training for LLMs, built from plugins.

Importing this package is cheap (no torch): plugin entry-point modules import ``hookimpl`` from
here. :func:`register` adds plugins defined in this process (a notebook, a test);
:func:`train` runs ``polyrl train`` with a list of overrides or a composed config.
"""

from __future__ import annotations

from typing import Any

from polyrl.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl", "register", "train"]


def register(*plugins: Any, **kwargs: Any) -> None:
    """Register plugins in this process: see :func:`polyrl.inprocess.register`."""
    from polyrl.inprocess import register as register_in_process

    register_in_process(*plugins, **kwargs)


def train(config: Any) -> Any:
    """Train with ``config``: a list of overrides (as on the command line) or a config from
    :func:`polyrl.config.load_config`. Validated first; returns the
    :class:`~polyrl.trainer.trainer.TrainResult`."""
    from polyrl.config import load_config
    from polyrl.config.validate import validate_config
    from polyrl.errors import ConfigError
    from polyrl.trainer.trainer import run

    cfg = load_config(list(config)) if isinstance(config, (list, tuple)) else config
    problems = validate_config(cfg)
    if problems:
        raise ConfigError("config is invalid: " + "; ".join(problems))
    return run(cfg)
