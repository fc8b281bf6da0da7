"""verl's interactions: a class that plays the user between assistant turns, listed in an
interaction-config YAML (``multi_turn.interaction_config_path``)::

    interaction:
      - name: gsm8k                      # optional: else the class name without "Interaction"
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}

Each entry's class is built as ``cls(config=<config with "name" added>)`` (verl's registry does
the same) and must have verl's four async methods:

- ``start_interaction(instance_id, **interaction_kwargs)`` when an episode starts;
- ``generate_response(instance_id, messages, **interaction_kwargs)`` after an assistant turn
  without tool calls, returning ``(should_terminate, response, score, metadata)``: ``response``
  is the next user message, ``should_terminate`` ends the episode;
- ``calculate_score(instance_id, **interaction_kwargs)``: the episode's score;
- ``finalize_interaction(instance_id, **interaction_kwargs)``: release the episode's state.

A row picks its interaction by ``extra_info.interaction_kwargs.name`` (required, as in verl);
the whole ``interaction_kwargs`` mapping reaches every call. ``class_name`` is an import path
(``pkg.mod.Name`` or ``pkg.mod:Name``) or ``path/to/file.py:Name``; verl's own classes cannot be
imported without verl, so those polyrl carries an equivalent of (:data:`VERL_EQUIVALENTS`) load
under verl's name. The classes run in the driver, where the tool classes of
``multi_turn.tool_config_path`` run: code that may hang or runs model output belongs in the
sandbox (:func:`polyrl.api.run_program`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyrl.api import ConfigError, import_user_file
from polyrl_env_tools.yaml_config import read_entries

KEY = "multi_turn.interaction_config_path"
METHODS = ("start_interaction", "generate_response", "calculate_score", "finalize_interaction")
#: verl's interaction classes that polyrl carries an equivalent of, by verl's class path.
VERL_EQUIVALENTS = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": (
        "polyrl_env_tools.gsm8k_interaction:Gsm8kInteraction"
    ),
}


@dataclass(frozen=True)
class InteractionEntry:
    """One ``interaction:`` entry: its name, class path and the config it is built with."""

    name: str
    class_name: str
    config: dict[str, Any]


def read_interaction_config(path: str) -> list[InteractionEntry]:
    """The entries of a verl interaction-config YAML; a bad file is one line naming it."""
    items = read_entries(path, KEY, "interaction", "{name, class_name, config}")
    if not items:
        raise ConfigError(f"{path}: the 'interaction:' list is empty")
    entries: list[InteractionEntry] = []
    for position, item in enumerate(items):
        where = f"{path}: interaction[{position}]"
        if not isinstance(item, Mapping) or not item.get("class_name"):
            raise ConfigError(f"{where} needs a class_name (an import path of the class)")
        config = item.get("config") or {}
        if not isinstance(config, Mapping):
            raise ConfigError(f"{where}: config must be a mapping, got {type(config).__name__}")
        class_name = str(item["class_name"])
        name = str(item.get("name") or default_name(class_name))
        if any(e.name == name for e in entries):
            raise ConfigError(f"{where}: the name {name!r} is used twice; give each a unique name")
        entries.append(InteractionEntry(name, class_name, {**dict(config), "name": name}))
    return entries


def default_name(class_name: str) -> str:
    """verl's name for an entry without one: the class's name, lower case, less a trailing
    ``Interaction``."""
    simple = class_name.replace(":", ".").rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def locate_problem(class_name: str) -> str | None:
    """Why ``class_name`` cannot be found, without running the user's code (for ``polyrl
    validate``); None when it can be."""
    target = VERL_EQUIVALENTS.get(class_name, class_name)
    where, _, _ = _split(target)
    if where.endswith(".py"):
        return None if Path(where).is_file() else f"no file {where}"
    if where.split(".")[0] == "verl" and importlib.util.find_spec("verl") is None:
        known = ", ".join(VERL_EQUIVALENTS)
        return (
            f"{class_name} is verl's, and verl is not installed (polyrl carries {known}); "
            "write the class without importing verl"
        )
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError) as exc:
        return f"cannot import {where} ({exc})"
    return None if found is not None else f"no module {where}"


def load_interactions(path: str) -> dict[str, Any]:
    """``{name: instance}`` of every entry of the interaction config at ``path``."""
    instances = {}
    for entry in read_interaction_config(path):
        cls = load_class(entry.class_name, f"{path}: interaction {entry.name!r}")
        instances[entry.name] = cls(config=entry.config)
    return instances


def load_class(class_name: str, where: str) -> type:
    """The class ``class_name`` names, checked to have verl's interaction methods."""
    target = VERL_EQUIVALENTS.get(class_name, class_name)
    problem = locate_problem(class_name)
    if problem:
        raise ConfigError(f"{where}: class_name {class_name!r}: {problem}")
    module_path, _, attribute = _split(target)
    try:
        if module_path.endswith(".py"):
            module = import_user_file(module_path, "polyrl_interaction")
        else:
            module = importlib.import_module(module_path)
        cls = getattr(module, attribute)
    except Exception as exc:  # the user's module failing to import: one line
        raise ConfigError(
            f"{where}: class_name {class_name!r} does not import ({type(exc).__name__}: {exc})"
        ) from exc
    missing = [m for m in METHODS if not inspect.iscoroutinefunction(getattr(cls, m, None))]
    if not inspect.isclass(cls) or missing:
        raise ConfigError(
            f"{where}: {class_name} must be a class with verl's async interaction methods; "
            f"missing or not async: {', '.join(missing) or 'it is not a class'}"
        )
    return cls


def _split(target: str) -> tuple[str, str, str]:
    """``(module or file, separator, attribute)`` of ``pkg.mod.Name``, ``pkg.mod:Name`` or
    ``file.py:Name``."""
    return target.rpartition(":" if ":" in target else ".")


def check_interaction_config(path: str) -> list[str]:
    """The problems of the interaction config at ``path``, one line each, found without running
    the user's code."""
    try:
        entries = read_interaction_config(path)
    except ConfigError as exc:
        return [str(exc)]
    problems = []
    for entry in entries:
        problem = locate_problem(entry.class_name)
        if problem:
            problems.append(
                f"{path}: interaction {entry.name!r}: class_name {entry.class_name!r}: {problem}"
            )
    return problems
