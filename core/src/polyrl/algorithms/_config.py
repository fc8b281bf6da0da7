"""Read a knob from whatever config object a caller has: an OmegaConf node, a plain ``dict``,
a dataclass or a ``SimpleNamespace``. Losses and estimators are called from the trainer with
OmegaConf nodes but from tests and notebooks with lighter objects; all must work alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """``config.key`` (or ``config[key]``), or ``default`` when absent or ``None``."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        try:
            value = getattr(config, key)
        except (AttributeError, KeyError):  # OmegaConf struct nodes raise a subclass of these
            value = default
    return default if value is None else value
