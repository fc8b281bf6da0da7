"""What every inference-engine rollout exchanges with the trainer, independent of the engine.

Two layouts, shared by the engine plugins (vLLM, SGLang) so that each engine only translates its
own requests and outputs:

* **The batch** :meth:`polyrl.interfaces.RolloutEngine.generate` returns (the same as verl's and
  the ``hf`` rollout's): ``prompts[B*n, P]`` left-padded as given, ``responses[B*n, R]``
  right-padded with the pad token, ``response_mask`` 1 on generated tokens (through the stop
  token), ``rollout_log_probs`` 0 on padding, ``input_ids = prompts ++ responses``,
  ``attention_mask = prompt mask ++ response_mask`` and
  ``position_ids = clamp(cumsum(attention_mask) - 1, 0)`` (real tokens numbered from 0; padding
  repeats a neighbour's position and is masked anyway), and the prompts' non-tensor fields
  repeated ``n`` times.
* **The weight stream** :meth:`~polyrl.interfaces.RolloutEngine.update_weights` receives: Hugging
  Face names and full shapes of the model folder's checkpoint. An engine that loads a stream in
  place ends up with a mix of old and new weights (or, in vLLM's layer-wise reload, half-built
  layers) when the stream fails midway or stops early, and would then sample silently from
  garbage. :class:`WeightStreamChecker` checks each tensor against the checkpoint and, after the
  stream, that nothing was left out, so that the engine can refuse to generate until a complete
  sync succeeds.

Pure torch and safetensors headers: no inference engine is imported, so this is testable alone.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Any

import torch

from polyrl.batch import Batch
from polyrl.errors import PolyrlError


# ---- the batch ---------------------------------------------------------------------------------
def strip_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The real prompt tokens of each row (where the mask is 1), as Python lists for an engine."""
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"prompts need input_ids and attention_mask of one shape [B, P], got "
            f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
        )
    rows = []
    for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
        tokens = [t for t, m in zip(ids, mask) if m]
        if not tokens:
            raise ValueError("a prompt row has no tokens (its attention_mask is all zero)")
        rows.append(tokens)
    return rows


def position_ids_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions over ``[prompt ++ response]``: real tokens numbered 0, 1, ... in order; left
    padding 0, right padding the last real position (the trainer masks both)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def assemble_rollout(
    prompts: Batch,
    samples: Sequence[tuple[Sequence[int], Sequence[float]]],
    *,
    n: int,
    max_new_tokens: int,
    pad_token_id: int,
) -> Batch:
    """Build the output batch. ``samples`` holds ``B * n`` ``(token_ids, log_probs)`` pairs, the
    ``n`` samples of prompt ``i`` at ``i*n .. i*n+n-1``; longer ones are cut to
    ``max_new_tokens``."""
    input_ids, attention_mask = prompts["input_ids"], prompts["attention_mask"]
    batch = input_ids.shape[0]
    if len(samples) != batch * n:
        raise ValueError(
            f"expected {batch * n} samples ({batch} prompts x n={n}), got {len(samples)}"
        )
    width = int(max_new_tokens)
    responses = torch.full((batch * n, width), int(pad_token_id), dtype=torch.long)
    response_mask = torch.zeros((batch * n, width), dtype=attention_mask.dtype)
    log_probs = torch.zeros((batch * n, width), dtype=torch.float32)
    for row, (tokens, lps) in enumerate(samples):
        length = min(len(tokens), width)
        if len(lps) < length:
            raise ValueError(f"sample {row} has {len(tokens)} tokens but {len(lps)} log-probs")
        if length:
            responses[row, :length] = torch.tensor(list(tokens[:length]), dtype=torch.long)
            response_mask[row, :length] = 1
            log_probs[row, :length] = torch.tensor(list(lps[:length]), dtype=torch.float32)
    prompt_ids = input_ids.repeat_interleave(n, dim=0)
    prompt_mask = attention_mask.repeat_interleave(n, dim=0)
    full_mask = torch.cat([prompt_mask, response_mask], dim=-1)
    return Batch(
        {
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "rollout_log_probs": log_probs,
            "input_ids": torch.cat([prompt_ids, responses.to(prompt_ids.dtype)], dim=-1),
            "attention_mask": full_mask,
            "position_ids": position_ids_for(full_mask),
        },
        {key: value for key, value in prompts.repeat_interleave(n).non_tensors.items()},
        dict(prompts.meta),
    )


# ---- the weight stream -------------------------------------------------------------------------
class WeightSyncError(PolyrlError):
    """A weight sync into a rollout engine failed or was incomplete."""


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
    Names the checkpoint lacks (a tied ``lm_head.weight`` a trainer sends) are left to the
    engine's loader, which knows which ones to skip. An empty manifest (no safetensors files)
    checks nothing."""

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

    def incomplete(self, received: int) -> tuple[str, str] | None:
        """After the stream (``received`` tensors): None when no checkpoint tensor was left out,
        else (why the engine's weights are now invalid, the :class:`WeightSyncError` message)."""
        missing = self.missing()
        if not missing:
            return None
        return (
            f"the last weight sync left out {len(missing)} of {len(self.manifest)} tensors "
            f"(e.g. {missing[:3]})",
            f"update_weights() received {received} tensors but not {len(missing)} the model "
            f"has, e.g. {missing[:3]}: the weight stream must hold the full model",
        )
