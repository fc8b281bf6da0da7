"""The plugin's own config section, ``plugins.swanlab.*`` (all optional)::

    plugins.swanlab.mode=online plugins.swanlab.workspace=my-team plugins.swanlab.tags=[grpo]

Light on purpose (no swanlab import): ``polyrl validate`` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MODES = ("online", "offline", "local", "disabled")


@dataclass
class SwanlabSettings:
    """``mode``: null is ``SWANLAB_MODE``, else offline. ``workspace``, ``tags`` and
    ``description`` are SwanLab's."""

    mode: Any = None
    workspace: Any = None
    tags: list[str] = field(default_factory=list)
    description: Any = None


def check_config(cfg: Any) -> list[str]:
    """``plugins.swanlab.mode`` is one of SwanLab's modes."""
    section = (cfg.get("plugins") or {}).get("swanlab") or {}
    mode = section.get("mode")
    if mode is not None and mode not in MODES:
        return [
            f"plugins.swanlab.mode={mode!r} is not a SwanLab mode; use one of {', '.join(MODES)}"
        ]
    return []
