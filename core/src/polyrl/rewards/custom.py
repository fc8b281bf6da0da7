"""A user's reward function loaded from a Python file (``custom_reward_function.path`` / ``.name``).

The function is called as ``fn(data_source, solution_str, ground_truth, extra_info)`` and returns
a float or a dict holding ``score`` (other numeric keys are logged as extras). The file is loaded
as a fresh module under a private name, so that it needs no package around it (verl's contract).
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from polyrl.errors import ConfigError
from polyrl.user_modules import import_file

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
    try:
        module = import_file(file, "polyrl_custom_reward")
    except (Exception, SystemExit) as exc:  # SystemExit is not success: the file is broken
        raise ConfigError(
            f"custom_reward_function.path={path!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
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


# Run in a fresh interpreter by check_custom_function: load the function, then say so.
_CHECK_CODE = (
    "import sys\n"
    "from polyrl.errors import PolyrlError\n"
    "from polyrl.rewards.custom import load_custom_function\n"
    "try:\n"
    "    load_custom_function(sys.argv[1], sys.argv[2])\n"
    "except PolyrlError as exc:\n"
    "    print(exc, file=sys.stderr)\n"
    "    sys.exit(1)\n"
    "print('polyrl-loaded-ok')\n"
)


def check_custom_function(path: str | Path, name: str, timeout_s: float) -> None:
    """Load ``path`` in a separate Python process, within ``timeout_s``: a file that calls
    ``sys.exit``/``os._exit``, blocks, or crashes the interpreter at import ends that process,
    not the driver, and becomes one :class:`ConfigError` naming the file.

    Why a process and not just the import here: user code runs at import, and the driver must not
    be taken down or hung by it before it has even started the run.
    """
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHECK_CODE, str(path), name],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"custom_reward_function.path={path!r} did not finish importing within "
            f"{timeout_s:g} s: does it block or do heavy work at import? Move that into "
            f"{name}() or a cached helper"
        ) from None
    if done.returncode == 0 and "polyrl-loaded-ok" in done.stdout:
        return
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    if done.returncode == 1 and lines:
        raise ConfigError(lines[-1])
    raise ConfigError(
        f"custom_reward_function.path={path!r} ended the Python process while being imported "
        f"(exit code {done.returncode}) before {name}() could be found: remove the sys.exit / "
        f"os._exit / crash at import from that file"
    )


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
