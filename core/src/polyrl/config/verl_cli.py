"""verl's ``--config-path X --config-name Y`` as polyrl overrides.

verl's own configs, ``ppo_trainer`` and ``ppo_megatron_trainer``, are polyrl's defaults (the
latter with the Megatron engine); the folder is then not read, since verl resolves it inside
its package. Any other name is a user's yaml in verl's layout, read from the folder (relative
to the working directory) with ``yaml.safe_load``: its keys become overrides placed before the
command line's, so they are checked like any override and the command line wins. Its
``defaults`` list may name one of verl's configs (and ``_self_``); its ``hydra`` section is
Hydra's own and is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from polyrl.errors import ConfigError

VERL_CONFIGS: dict[str, list[str]] = {
    "ppo_trainer": [],
    "ppo_megatron_trainer": ["actor_rollout_ref.actor.strategy=megatron"],
}


def config_file_overrides(path: str | None, name: str | None) -> list[str]:
    """The overrides that ``--config-path path --config-name name`` stand for."""
    if not name:
        raise ConfigError(
            "--config-path needs --config-name: the yaml file's name in that folder, e.g. "
            "--config-name=ppo_trainer (verl's defaults)"
        )
    stem = name.removesuffix(".yaml")
    if stem in VERL_CONFIGS:
        return list(VERL_CONFIGS[stem])
    file = Path(path or ".") / f"{stem}.yaml"
    if not file.is_file():
        raise ConfigError(
            f"--config-name {name}: no {stem}.yaml under --config-path {path or '.'}; name "
            f"verl's ppo_trainer or ppo_megatron_trainer, or a yaml in that folder"
        )
    import yaml

    content = yaml.safe_load(file.read_text()) or {}
    if not isinstance(content, dict):
        raise ConfigError(
            f"{file} must hold a mapping of config groups, got {type(content).__name__}"
        )
    base: list[str] = []
    for entry in content.pop("defaults", None) or []:
        if entry == "_self_":
            continue
        if not isinstance(entry, str) or entry not in VERL_CONFIGS:
            raise ConfigError(
                f"{file}: defaults entry {entry!r} is not supported; a verl-layout file may "
                f"build on ppo_trainer or ppo_megatron_trainer only"
            )
        base += VERL_CONFIGS[entry]
    content.pop("hydra", None)
    return [*base, *(f"{key}={_override_value(value)}" for key, value in _leaves(content, ""))]


def _leaves(node: dict[str, Any], prefix: str) -> list[tuple[str, Any]]:
    leaves = []
    for key, value in node.items():
        if isinstance(value, dict) and value:
            leaves += _leaves(value, f"{prefix}{key}.")
        else:
            leaves.append((f"{prefix}{key}", value))
    return leaves


def _override_value(value: Any) -> str:
    """``value`` in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override_value(v)}" for k, v in value.items()) + "}"
    return f"'{_quoted(str(value))}'"


def _quoted(text: str) -> str:
    """``text`` for a single-quoted Hydra string: Hydra reads a backslash as an escape only in a
    run of them before a quote (the closing one included), so only those runs are doubled and
    each quote escaped; any other backslash (a Jinja chat template's ``'\\n'``) stays as is."""
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    return re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
