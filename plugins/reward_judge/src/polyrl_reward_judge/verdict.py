"""Turning a judge's reply (its verdict) into a score in [0, 1], or saying why it cannot.

Pure functions of the text and the settings. A verdict that does not parse is returned as
:class:`Unparsed` with a short reason, never as 0.0: the provider counts it (a judge that
babbles must not look like a judge that says "bad answer")."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Unparsed:
    """A verdict that gave no score; ``reason`` is short and the same for the same kind of
    failure (polyrl's reward stage groups failures by it)."""

    reason: str


def parse_verdict(text: str, settings: Any) -> float | Unparsed:
    """The score of ``text`` under ``settings.verdict`` (score | pass_fail | json)."""
    mode = str(settings.verdict)
    if mode == "score":
        return parse_score(
            text, str(settings.score_pattern), float(settings.score_min), float(settings.score_max)
        )
    if mode == "pass_fail":
        return parse_pass_fail(text, str(settings.pass_pattern), str(settings.fail_pattern))
    if mode == "json":
        return parse_json(
            text, str(settings.json_field), float(settings.score_min), float(settings.score_max)
        )
    raise ValueError(f"unknown verdict mode {mode!r}")


def scale(value: float, low: float, high: float) -> float | Unparsed:
    """``value`` mapped linearly from [low, high] to [0, 1]; outside the range (or not finite)
    it is unparsed: a judge answering 12 on a 0-10 scale did not follow the instructions, and
    clipping would hide it."""
    if not math.isfinite(value) or not low <= value <= high:
        return Unparsed(f"judge score out of range [{low:g}, {high:g}]")
    return (value - low) / (high - low)


def parse_score(text: str, pattern: str, low: float, high: float) -> float | Unparsed:
    """The first match of ``pattern``'s group as a number, scaled from [low, high]."""
    match = re.search(pattern, text)
    if match is None:
        return Unparsed("judge verdict has no score (score_pattern did not match)")
    try:
        value = float(match.group(1))
    except ValueError:
        return Unparsed("judge score is not a number")
    return scale(value, low, high)


def parse_pass_fail(text: str, pass_pattern: str, fail_pattern: str) -> float | Unparsed:
    """1.0 when only ``pass_pattern`` matches, 0.0 when only ``fail_pattern`` does; both or
    neither is unparsed (an ambiguous verdict is not a decision)."""
    passed = re.search(pass_pattern, text) is not None
    failed = re.search(fail_pattern, text) is not None
    if passed and failed:
        return Unparsed("judge verdict says both pass and fail")
    if passed:
        return 1.0
    if failed:
        return 0.0
    return Unparsed("judge verdict says neither pass nor fail")


def parse_json(text: str, field: str, low: float, high: float) -> float | Unparsed:
    """The number at ``field`` (dotted for nested objects) of the first JSON object in
    ``text``, scaled from [low, high]; a boolean counts as 0 or 1 before scaling."""
    obj = first_json_object(text)
    if obj is None:
        return Unparsed("judge verdict has no JSON object")
    value: Any = obj
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            return Unparsed(f"judge JSON has no field {field!r}")
        value = value[part]
    if isinstance(value, bool):
        value = float(value)
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return Unparsed(f"judge JSON field {field!r} is not a number")
    if not isinstance(value, (int, float)):
        return Unparsed(f"judge JSON field {field!r} is not a number")
    return scale(float(value), low, high)


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first ``{...}`` in ``text`` that decodes as a JSON object (judges often wrap it in
    prose or a code fence)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            return obj
        start = text.find("{", start + 1)
    return None
