"""Moved: DPO's preference pairs (``PreferenceDataset``, ``PreferenceLoader``, ``collate_pairs``,
``PREFERENCE_BATCH_KEYS`` ...) are the DPO plugin's, :mod:`polyrl_algo_dpo.preference`.

Names imported from here still resolve, with a :class:`DeprecationWarning`, while the plugin
(``polyrl-algo-dpo``) is installed. Importing this module imports nothing of the plugin.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_HOME = "polyrl_algo_dpo.preference"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        home = importlib.import_module(_HOME)
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"polyrl.data.preference.{name} moved to {_HOME}.{name}, which is not installed: "
            "pip install polyrl-algo-dpo"
        ) from exc
    value = getattr(home, name)
    warnings.warn(
        f"polyrl.data.preference is deprecated: import {name} from {_HOME}",
        DeprecationWarning,
        stacklevel=2,
    )
    return value
