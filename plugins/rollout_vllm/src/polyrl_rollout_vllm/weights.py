"""Checks on the weight stream of a sync (light: safetensors headers only, no vLLM).

Why: vLLM's in-place reload first moves every layer to the meta device and rebuilds each layer as
its tensors arrive. A stream that stops early or carries a wrongly shaped tensor leaves layers
half-built, and generating from them would silently sample from garbage. So the engine checks
each tensor against the checkpoint it was started from, and after the stream that nothing was
left out, and refuses to generate until a complete sync succeeds.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from polyrl.errors import PolyrlError


class WeightSyncError(PolyrlError):
    """A weight sync into the vLLM engine failed or was incomplete."""


def checkpoint_manifest(model_path: str) -> dict[str, tuple[int, ...]]:
    """``{tensor name: shape}`` of the model folder's safetensors files (headers only)."""
    from safetensors import safe_open

    manifest: dict[str, tuple[int, ...]] = {}
    for file in sorted(glob.glob(os.path.join(model_path, "*.safetensors"))):
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                manifest[name] = tuple(handle.get_slice(name).get_shape())
    return manifest


class WeightStreamChecker:
    """Follows one stream: shapes of known names must match; every checkpoint tensor must come.
    Names the checkpoint lacks (a tied ``lm_head.weight`` a trainer sends) are left to vLLM's
    loader, which knows which ones to skip. An empty manifest (no safetensors files) checks
    nothing."""

    def __init__(self, manifest: dict[str, tuple[int, ...]], model_path: str) -> None:
        self.manifest = manifest
        self.model_path = model_path
        self.seen: set[str] = set()

    def check(self, name: str, tensor: Any) -> None:
        expected = self.manifest.get(name)
        if expected is not None and tuple(tensor.shape) != expected:
            raise WeightSyncError(
                f"weight sync: {name!r} has shape {tuple(tensor.shape)} from the trainer but "
                f"{expected} in {self.model_path}; trainer and rollout must load the same model"
            )
        self.seen.add(name)

    def missing(self) -> list[str]:
        return sorted(set(self.manifest) - self.seen)
