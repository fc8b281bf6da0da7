"""verl's ``load_extern_object``: a class the user names by ``<path>`` and ``<name>`` keys
(``data.sampler.class_path``, ``data.custom_cls.path``). ``pkg://dotted.module`` (or
``pkg://dotted/module``) imports a module; ``file://path.py`` or a plain path loads a file, once,
under a private module name (it needs no package around it). Located without running it for
``polyrl validate``; loaded where the run builds its data, in the driver."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from polyrl.errors import ConfigError
from polyrl.user_modules import import_file

PKG_PREFIX = "pkg://"
FILE_PREFIX = "file://"


def _target(path: str) -> tuple[str, str]:
    """``("module", dotted name)`` or ``("file", path)`` of verl's forms."""
    if path.startswith(PKG_PREFIX):
        return "module", path[len(PKG_PREFIX) :].replace("/", ".")
    return "file", path.removeprefix(FILE_PREFIX)


def location_problem(key: str, path: str) -> str | None:
    """Why the module or file ``key=path`` names cannot be found; None when it can be."""
    kind, where = _target(path)
    if kind == "file":
        if Path(where).expanduser().is_file():
            return None
        return f"{key}={path!r}: no such file (pkg://dotted.module imports a module)"
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError) as exc:
        return f"{key}={path!r}: cannot import {where} ({exc})"
    return None if found else f"{key}={path!r}: no module {where}"


def class_problems(group: str, path_key: str, name_key: str, node: Any, instead: str) -> list[str]:
    """What is wrong with the user class a config group names (``group.path_key`` and
    ``group.name_key``), found without running it; ``instead``: what applies when neither is
    set."""
    path, name = node.get(path_key), node.get(name_key)
    if path is None and name is None:
        return []
    if not path or not name:
        return [
            f"{group}.{path_key} and {group}.{name_key} go together (the module or file, and "
            f"the class in it); set both, or neither for {instead}"
        ]
    problem = location_problem(f"{group}.{path_key}", str(path))
    return [problem] if problem else []


def load_user_class(key: str, path: str, name: str) -> type:
    """The class ``name`` of the module or file ``path`` (``key``: the config key naming it)."""
    kind, where = _target(path)
    try:
        module = (
            importlib.import_module(where)
            if kind == "module"
            else import_file(where, "polyrl_user")
        )
    except Exception as exc:  # the user's module failing to import: one line
        raise ConfigError(f"{key}={path!r} does not import ({type(exc).__name__}: {exc})") from exc
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ConfigError(f"{name!r} is not a class in {key}={path!r}")
    return cls
