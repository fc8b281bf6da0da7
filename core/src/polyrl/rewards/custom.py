"""A user's reward function loaded from a Python file (``custom_reward_function.path`` / ``.name``).

The function is called as ``fn(data_source, solution_str, ground_truth, extra_info)`` and returns
a float or a dict holding ``score`` (other numeric keys are logged as extras). The file is loaded
as a fresh module under a private name, so that it needs no package around it (verl's contract).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from polyrl.errors import ConfigError

ScoreFn = Callable[[str, str, Any, dict[str, Any]], Any]


def load_custom_function(path: str | Path, name: str = "compute_score") -> ScoreFn:
    """Import ``path`` and return its callable ``name``.

    Raises :class:`polyrl.errors.ConfigError` when the file is missing, fails to import, lacks
    ``name``, or ``name`` is not callable; each message names the key to fix.
    """
    file = Path(str(path)).expanduser()
    if not file.is_file():
        raise ConfigError(
            f"custom_reward_function.path={path!r}: no such file "
            f"(resolved to {file.resolve()}). Give the path of a .py file that defines "
            f"{name}(data_source, solution_str, ground_truth, extra_info)."
        )
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    module_name = f"polyrl_custom_reward_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise ConfigError(f"custom_reward_function.path={path!r} cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ConfigError(
                f"custom_reward_function.path={path!r} failed to import: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        sys.modules[module_name] = module
    if not hasattr(module, name):
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(
            f"custom_reward_function.name={name!r} is not defined in {file}; "
            f"callables there: {public or 'none'}. Set custom_reward_function.name to one of them."
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise ConfigError(
            f"custom_reward_function.name={name!r} in {file} is a {type(fn).__name__}, "
            "not a function"
        )
    return fn


def normalise_score(value: Any) -> tuple[float, dict[str, float]]:
    """``(score, extras)`` from a scorer's return value.

    Accepts a real number (bool and numpy scalars included) or a mapping with a numeric ``score``;
    the mapping's other numeric values become extras, non-numeric ones are dropped. Raises
    TypeError/ValueError (reported per sample by the runner) for anything else or a non-finite
    score.
    """
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(
                f"reward function returned a dict without 'score' (keys: {sorted(value)})"
            )
        score = _as_float(value["score"], "score")
        extras: dict[str, float] = {}
        for key, item in value.items():
            if key == "score":
                continue
            try:
                extras[str(key)] = _as_float(item, str(key))
            except (TypeError, ValueError):
                continue
        return score, extras
    return _as_float(value, "return value"), {}


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, str) or value is None:
        raise TypeError(f"reward function {what} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"reward function {what} must be a number, got {type(value).__name__}"
        ) from exc
    if not math.isfinite(number):
        raise ValueError(f"reward function {what} is not finite ({number})")
    return number
