"""Turning whatever the trainer computed into plain Python floats, and picking the key figures.

Metrics arrive as floats, ints, bools, numpy scalars or 0-d / one-element torch tensors. Every
logger needs plain floats (JSON, TensorBoard and wandb all choke on tensors, and a tensor on a
GPU would keep a device reference alive), so the conversion lives in one place. This module must
not import torch or numpy: ``float()`` already understands their scalars.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

#: verl's names for the figures a progress display shows, in display order.
TRAIN_REWARD_KEY = "critic/score/mean"
KL_KEYS = ("actor/kl_loss", "actor/ppo_kl")
RESPONSE_LENGTH_KEY = "response_length/mean"
STEP_TIME_KEY = "timing_s/step"
#: ``val-core/<data_source>/reward/mean@<n>``: verl's validation reward per data source.
VAL_REWARD_PATTERN = re.compile(r"^val-core/(?P<source>.+)/reward/mean@(?P<n>\d+)$")


def to_float(key: str, value: Any) -> float:
    """``value`` as a Python float; a clear ``TypeError`` naming ``key`` when it is not a scalar.

    Strings are refused on purpose: a metric that arrives as text is a bug upstream, and writing
    it silently would make the curve disappear without anyone noticing.
    """
    if isinstance(value, float):
        return value
    if isinstance(value, (str, bytes)):
        raise TypeError(f"metric {key!r} is a string ({value!r}); metrics must be numbers")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(
            f"metric {key!r} has type {type(value).__name__}, which is not a scalar number "
            f"({exc}); reduce it to one number (e.g. .mean().item()) before logging"
        ) from exc


def to_float_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Every value of ``metrics`` as a float (see :func:`to_float`); keys must be strings."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric names must be strings, got {key!r}")
        out[key] = to_float(key, value)
    return out


def finite_or_none(value: float) -> float | None:
    """``value``, or ``None`` for NaN and +-inf (JSON has no spelling for them)."""
    return value if math.isfinite(value) else None


def val_rewards(metrics: Mapping[str, float]) -> dict[str, float]:
    """The validation reward per data source, from ``val-core/<source>/reward/mean@<n>`` keys.

    When one source has several ``n`` (mean@1 and mean@4), the smallest ``n`` wins: that is the
    figure comparable across runs with different sampling settings.
    """
    best: dict[str, tuple[int, float]] = {}
    for key, value in metrics.items():
        match = VAL_REWARD_PATTERN.match(key)
        if match is None:
            continue
        source, n = match.group("source"), int(match.group("n"))
        if source not in best or n < best[source][0]:
            best[source] = (n, value)
    return {source: value for source, (_, value) in best.items()}


def first_present(metrics: Mapping[str, float], keys: tuple[str, ...]) -> float | None:
    """The value of the first of ``keys`` present in ``metrics``."""
    for key in keys:
        if key in metrics:
            return metrics[key]
    return None
