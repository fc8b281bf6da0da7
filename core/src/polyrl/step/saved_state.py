"""A step's state in a file: how a checkpoint keeps the batch generated ahead of its step.

One-step off-policy training (``polyrl_schedule_offpolicy.one_step_off``) has the next step's
samples in hand when a checkpoint is written; they were drawn by a policy the checkpoint no longer
holds, so they cannot be regenerated on resume. The file holds tensors and plain Python data only
(numpy values become Python ones), so it loads with ``torch.load(weights_only=True)``
(:func:`polyrl.safe_load.load_plain`): a checkpoint file never runs code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from polyrl.batch import Batch
from polyrl.errors import PolyrlError
from polyrl.safe_load import load_plain
from polyrl.step.pipeline import StepState

FORMAT = 1


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays (also inside lists, tuples and dicts) turned into
    Python numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {key: plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def save_step_state(path: str, state: StepState) -> None:
    """Write ``state`` (step, batch, metrics, timings) to ``path``."""
    batch = state.batch
    torch.save(
        {
            "format": FORMAT,
            "step": state.step,
            "tensors": {key: t.detach().cpu().clone() for key, t in batch.tensors.items()},
            "non_tensors": {key: plain(list(a)) for key, a in batch.non_tensors.items()},
            "meta": plain(batch.meta),
            "metrics": dict(state.metrics),
            "timing": dict(state.timing),
        },
        path,
    )


def load_step_state(path: str) -> StepState:
    """The :class:`StepState` :func:`save_step_state` wrote to ``path``."""
    saved = load_plain(path)
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise PolyrlError(
            f"{path} is not a step state written by this polyrl (format {FORMAT}); resume from a "
            f"checkpoint of this version"
        )
    batch = Batch(saved["tensors"], saved["non_tensors"], saved["meta"])
    return StepState(
        step=int(saved["step"]), batch=batch, metrics=saved["metrics"], timing=saved["timing"]
    )
