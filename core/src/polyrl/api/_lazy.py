"""Lazy module attributes for the API modules: a name resolves to its ``"module:attr"`` target
on first access, so importing the API imports none of the heavy modules behind it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_attributes(
    module: str, table: Mapping[str, str], names: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``module``: ``table`` maps names to ``"module:attr"``
    (``"module"`` for a module); a resolved name is cached in the module's globals."""

    def __getattr__(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        module_name, _, attribute = target.partition(":")
        value: Any = importlib.import_module(module_name)
        if attribute:
            value = getattr(value, attribute)
        vars(sys.modules[module])[name] = value  # resolved once
        return value

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
