"""Modules whose contents moved into a plugin package: their old import path keeps working,
with a :class:`DeprecationWarning` naming the new one, while that package is installed (an
ecosystem does not break its authors). Importing the old module imports nothing of the plugin."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved_to(old: str, home: str, package: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old`` that takes each name from the module ``home`` of the
    distribution ``package``, or says which package to install."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(home)
        except ModuleNotFoundError as exc:
            raise ImportError(
                f"{old}.{name} moved to {home}.{name}, which is not installed: "
                f"pip install {package}"
            ) from exc
        value = getattr(module, name)
        warnings.warn(
            f"{old} is deprecated: import {name} from {home}", DeprecationWarning, stacklevel=2
        )
        return value

    return __getattr__
