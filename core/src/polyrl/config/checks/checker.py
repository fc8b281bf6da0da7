"""The problem collector shared by every check, and safe accessors of a config."""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from polyrl.registry import Registry

MISSING = object()
"""What :func:`get` returns for a key that is absent or left at ``???``."""


def get(cfg: Any, key: str) -> Any:
    """The value at dotted ``key`` (containers as plain dicts/lists); :data:`MISSING` when the key
    is absent or set to ``???``."""
    try:
        value = OmegaConf.select(cfg, key, default=MISSING, throw_on_missing=True)
    except MissingMandatoryValue:
        return MISSING
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def as_list(value: Any) -> list[Any]:
    if value is None or value is MISSING:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


class Notice(str):
    """A line a config check returns that is not a problem: how polyrl honours a setting in its
    own way (a verl key whose effect here is broader, such as FSDP2 offloading parameters and
    optimizer together). Why a type of its own: a plugin's ``config_check`` returns plain lines,
    and a notice must reach the user without refusing the config; validation logs it once
    per run (:func:`notice_once`)."""

    __slots__ = ()


# Notices are logged under the validator's name, once per process (the driver validates before
# it starts, and ``polyrl validate`` once).
_notice_log = logging.getLogger("polyrl.config.validate")
_noticed: set[str] = set()


def notice_once(line: str) -> None:
    """Log ``line`` as a warning unless this process has logged it already."""
    if line not in _noticed:
        _noticed.add(line)
        _notice_log.warning("%s", line)


class Checker:
    """Collects problems; each helper adds at most one line per key. Notices are logged, not
    collected (:meth:`notice`)."""

    def __init__(self, cfg: DictConfig, registry: Registry) -> None:
        self.cfg = cfg
        self.registry = registry
        self.problems: list[str] = []

    def add(self, message: str) -> None:
        self.problems.append(message)

    def notice(self, line: str) -> None:
        """A line that does not make the config invalid: logged once per run."""
        notice_once(line)

    def get(self, key: str) -> Any:
        return get(self.cfg, key)

    # ---- generic range checks -----------------------------------------------------------
    def number(
        self,
        key: str,
        ok: Callable[[float], bool],
        expectation: str,
        *,
        optional: bool = False,
        integer: bool = False,
    ) -> Any:
        """Check ``key`` is a number satisfying ``ok``; return it (or None when unusable)."""
        value = self.get(key)
        if value is MISSING:
            self.add(f"{key} is not set: give it on the command line, e.g. {key}=<value>")
            return None
        if value is None:
            if not optional:
                self.add(f"{key} is null but must be {expectation}: set {key}=<value>")
            return None
        if not is_number(value) or (integer and not isinstance(value, int)):
            kind = "an integer" if integer else "a number"
            self.add(f"{key}={value!r} must be {kind} ({expectation})")
            return None
        if not math.isfinite(value) or not ok(value):
            self.add(f"{key}={value} is out of range: it must be {expectation}")
            return None
        return value

    def choice(self, key: str, allowed: Iterable[str], *, optional: bool = False) -> Any:
        """Check ``key`` is one of ``allowed`` (or null when ``optional``); return it or None."""
        allowed = tuple(allowed)
        value = self.get(key)
        if optional and value is None:
            return None
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            null = " or null" if optional else ""
            self.add(f"{key}={value!r} is not one of {', '.join(allowed)}{null}.{hint}")
            return None
        return value
