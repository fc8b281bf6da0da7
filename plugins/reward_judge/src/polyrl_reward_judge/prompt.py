"""The judge's prompt: the template with a sample's fields filled in.

Only ``{name}`` placeholders are replaced (not ``str.format``): a template may show the judge a
JSON example such as ``{"score": 7}`` without doubling its braces."""

from __future__ import annotations

import re
from typing import Any

from polyrl.api import RewardSample

PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")


def placeholders(template: str) -> list[str]:
    """The placeholder names ``template`` uses, in order of first use."""
    return list(dict.fromkeys(PLACEHOLDER.findall(template)))


def render(template: str, rubric: str, sample: RewardSample) -> str:
    """``template`` with ``{question}`` (the prompt), ``{response}``, ``{reference}`` (the
    ground truth; empty when there is none) and ``{rubric}`` filled in."""
    values = {
        "question": sample.prompt_str,
        "response": sample.solution_str,
        "reference": _text(sample.ground_truth),
        "rubric": rubric,
    }
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def _text(value: Any) -> str:
    return "" if value is None else str(value)
