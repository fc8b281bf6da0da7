"""Saving a transformers model without importing DeepSpeed.

``PreTrainedModel.save_pretrained`` unwraps the model with accelerate, which imports DeepSpeed
wherever it is installed (and mlflow and pydantic through it) only to ask whether the model is
a DeepSpeed engine: seconds of CPU in every export of every engine, and in every process that
writes the built-in tiny model. While DeepSpeed is not imported, no object can be one of its
engines, so the question is answered without importing it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


def save_hf_model(model: Any, path: str, **kwargs: Any) -> None:
    """``model.save_pretrained(path, **kwargs)``, leaving DeepSpeed unimported when it is."""
    with _deepspeed_left_unimported():
        model.save_pretrained(path, **kwargs)


@contextlib.contextmanager
def _deepspeed_left_unimported() -> Iterator[None]:
    other = sys.modules.get("accelerate.utils.other")
    if "deepspeed" in sys.modules or other is None or not hasattr(other, "is_deepspeed_available"):
        yield
        return
    asked = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = asked
