"""The plugin's own config section, ``plugins.wandb.*`` (all optional)::

    plugins.wandb.entity=my-team plugins.wandb.group=grpo-sweep plugins.wandb.tags=[gsm8k,7b]
    plugins.wandb.mode=offline      # online | offline | disabled; WANDB_MODE wins over it

Project and run name come from ``trainer.project_name`` / ``trainer.experiment_name``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polyrl.api import ConfigError

MODES = ("online", "offline", "disabled")


@dataclass
class WandbLoggerConfig:
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    notes: str | None = None
    mode: str | None = None

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> WandbLoggerConfig:
        """Read ``plugins.wandb`` from the whole resolved config (``LoggerContext.config``);
        unknown keys and wrong types are a :class:`ConfigError` naming the key."""
        plugins = config.get("plugins") or {}
        section = plugins.get("wandb") if isinstance(plugins, Mapping) else None
        if section is None:
            return cls()
        if not isinstance(section, Mapping):
            raise ConfigError(f"plugins.wandb must be a mapping of options, got {section!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(
                f"unknown key(s) plugins.wandb.{', plugins.wandb.'.join(unknown)}; "
                f"valid keys: {', '.join(sorted(known))}"
            )
        values = dict(section)
        for key in ("entity", "group", "notes", "mode"):
            if values.get(key) is not None and not isinstance(values[key], str):
                raise ConfigError(f"plugins.wandb.{key} must be a string, got {values[key]!r}")
        tags = values.get("tags") or []
        if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
            raise ConfigError(f"plugins.wandb.tags must be a list of strings, got {tags!r}")
        values["tags"] = list(tags)
        if values.get("mode") is not None and values["mode"] not in MODES:
            raise ConfigError(
                f"plugins.wandb.mode={values['mode']!r} is not valid; use one of {', '.join(MODES)}"
            )
        return cls(**values)
