"""Old import paths of what moved from ``polyrl_engine_fsdp`` into this package.

The engine toolkit lived inside the FSDP engine's package before the DeepSpeed and Megatron
engines shared it. Code outside polyrl may still import it from there, so the old names keep
working: each warns once with the new import and hands out the very object of the new place (a
test that monkeypatches the old module patches the code that runs). A module that moved whole is
found through a finder (:func:`redirect_modules`); a module that kept part of its names lends
the rest through its ``__getattr__`` (:func:`moved_names`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}; import it from there (the old name will be removed)",
        DeprecationWarning,
        stacklevel=3,
    )


class _Redirect(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``<old>.<name>`` as ``<new>.<name>`` for each moved module ``name``."""

    def __init__(self, old: str, new: str, modules: Iterable[str]) -> None:
        self.targets = {f"{old}.{name}": f"{new}.{name}" for name in modules}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.targets:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self.targets[spec.name]
        _warn(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module is the new one, imported already."""


def redirect_modules(old: str, new: str, modules: Iterable[str]) -> None:
    """Make ``import <old>.<name>`` give the module ``<new>.<name>`` (the same object), with a
    deprecation warning, for each of ``modules``; called by the package ``old`` when it loads."""
    sys.meta_path.append(_Redirect(old, new, modules))


def moved_names(old: str, new: str, names: Iterable[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old``, which kept some of its names: each of ``names`` is
    taken from ``new`` with a warning; any other missing name is an ``AttributeError``."""
    moved = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        _warn(f"{old}.{name}", f"{new}.{name}")
        return getattr(importlib.import_module(new), name)

    return __getattr__
