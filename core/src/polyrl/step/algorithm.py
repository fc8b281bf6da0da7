"""Moved: algorithm selection and the step's construction are the run plan's
(:mod:`polyrl.plan`). The old names keep working here with a deprecation warning."""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = {
    "select_algorithm": "polyrl.plan",
    "build_pipeline": "polyrl.plan",
    "FALLBACK_ALGORITHM": "polyrl.plan",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    warnings.warn(
        f"polyrl.step.algorithm.{name} moved: import it from {_MOVED[name]}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(_MOVED[name]), name)
