"""Config nodes for code that reads config by attribute.

Components (engines, reward providers) are handed a config node: in a run, a ``DictConfig`` built
from :mod:`polyrl.config.schema` (or the plain dict of one, once it crossed a process boundary);
in tests and notebooks, often a partial dict. :func:`schema_node` turns any of these into a node
with every declared key, so readers use ``node.key`` and never restate a default: missing keys
take the schema's defaults, and an undeclared key is an error naming the closest valid one.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from polyrl.config.sections import schema_defaults
from polyrl.errors import ConfigError


def schema_node(node: Any, path: str) -> Any:
    """The node for the schema group at dotted ``path`` (e.g. ``"actor_rollout_ref.actor"``).

    A ``DictConfig`` is returned unchanged (it comes from the schema). ``None``, a mapping or a
    dataclass instance is merged over the schema's node at ``path``, inside a whole default
    config so that interpolated defaults (``${actor_rollout_ref...}``) resolve.
    """
    if isinstance(node, DictConfig):
        return node
    if node is None:
        node = {}
    elif is_dataclass(node) and not isinstance(node, type):
        node = OmegaConf.structured(node)
    elif not isinstance(node, Mapping):
        raise ConfigError(f"{path} must be a config mapping, got {type(node).__name__}: {node!r}")
    nested: Any = node
    for part in reversed(path.split(".")):
        nested = {part: nested}
    try:
        merged = OmegaConf.merge(schema_defaults(), nested)  # merge copies: no change
    except OmegaConfBaseException as exc:
        raise ConfigError(_merge_message(path, exc)) from exc
    return OmegaConf.select(merged, path)


def _merge_message(path: str, exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or path
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "Key '" in message and "not in" in message:
        from polyrl.config.keys import schema_keys

        leaf = message.split("Key '", 1)[1].split("'", 1)[0]
        parent = key.rpartition(".")[0] if key.endswith(leaf) else key
        siblings = [k.rpartition(".")[2] for k in schema_keys() if k.rpartition(".")[0] == parent]
        close = difflib.get_close_matches(leaf, siblings, n=1)
        hint = f" Did you mean {parent}.{close[0]}?" if close else ""
        return f"unknown config key {parent}.{leaf}.{hint}"
    return f"{key}: {message}"
