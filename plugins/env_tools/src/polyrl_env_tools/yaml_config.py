"""verl's YAML configs of tools and interactions: a top-level list of entries, read with errors
of one line that name the file and the key that named it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyrl.api import ConfigError


def read_entries(path: str, key: str, group: str, shape: str) -> list[Any]:
    """The ``group:`` list of the YAML file ``path`` (named by the config key ``key``); ``shape``
    says what its entries hold, for the error."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ConfigError(
            f"{key}={path!r} cannot be read ({exc.strerror}); give a verl {group} config YAML"
        ) from exc
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"{key}={path!r} is not valid YAML ({detail})") from exc
    entries = data.get(group) if isinstance(data, Mapping) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: a {group} config needs a '{group}:' list of {shape}")
    return entries
