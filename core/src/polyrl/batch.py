"""The batch that moves between the controller and the workers.

A :class:`Batch` is a set of tensors sharing their first dimension, plus per-row non-tensor
fields (numpy object arrays: ``uid``, ``data_source``, ground truths ...) and a small ``meta``
dict. It splits by data-parallel rank, concatenates, repeats and selects rows.

We do not use ``tensordict`` here: its releases pin narrow torch ranges, which would tie the core
to one torch version (the version hell we promise to avoid), and we need only these few operations.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class Batch:
    """Row-aligned tensors and non-tensor fields."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensors = {k: _as_object_array(v) for k, v in self.non_tensors.items()}
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.non_tensors.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch fields have different numbers of rows: {sizes}")

    # ---- access ----------------------------------------------------------------------------
    def __len__(self) -> int:
        for value in self.tensors.values():
            return int(value.shape[0])
        for array in self.non_tensors.values():
            return len(array)
        return 0

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(
            f"batch has no field {key!r}; it has {sorted(self.tensors) + sorted(self.non_tensors)}"
        )

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.tensors[key] = value
        else:
            self.non_tensors[key] = _as_object_array(value)

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        return self.non_tensors.get(key, default)

    # ---- row operations ---------------------------------------------------------------------
    def select_rows(self, index: Sequence[int] | np.ndarray | torch.Tensor) -> Batch:
        """A new batch with the given rows, in that order."""
        idx = torch.as_tensor(np.asarray(index), dtype=torch.long)
        np_idx = idx.numpy()
        return Batch(
            {k: v[idx.to(v.device)] for k, v in self.tensors.items()},
            {k: v[np_idx] for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    def select_keys(self, keys: Sequence[str]) -> Batch:
        """A new batch holding only ``keys`` (shares storage)."""
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.non_tensors.items() if k in keys},
            dict(self.meta),
        )

    def chunk(self, chunks: int) -> list[Batch]:
        """Split into ``chunks`` equal parts (by data-parallel rank); the size must divide."""
        if len(self) % chunks:
            raise ValueError(
                f"cannot split a batch of {len(self)} rows into {chunks} equal parts; "
                f"make the batch size a multiple of {chunks}"
            )
        size = len(self) // chunks
        return [self.slice(i * size, (i + 1) * size) for i in range(chunks)]

    def split(self, size: int) -> list[Batch]:
        """Consecutive parts of ``size`` rows (the last may be shorter)."""
        return [self.slice(start, start + size) for start in range(0, len(self), size)]

    def slice(self, start: int, stop: int) -> Batch:
        return Batch(
            {k: v[start:stop] for k, v in self.tensors.items()},
            {k: v[start:stop] for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    def repeat_interleave(self, repeats: int) -> Batch:
        """Each row ``repeats`` times in a row, ``[a, b] -> [a, a, b, b]``: n samples per prompt."""
        return Batch(
            {k: v.repeat_interleave(repeats, dim=0) for k, v in self.tensors.items()},
            {k: np.repeat(v, repeats) for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    def union(self, other: Batch) -> Batch:
        """Fields of both (same rows); ``other`` wins on a shared key."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        return Batch(
            {**self.tensors, **other.tensors},
            {**self.non_tensors, **other.non_tensors},
            {**self.meta, **other.meta},
        )

    def to(self, device: str | torch.device) -> Batch:
        return Batch(
            {k: v.to(device) for k, v in self.tensors.items()}, self.non_tensors, self.meta
        )

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all batches in order. Tensors whose last dimension differs are right-padded
        with zeros (masks stay zero on padding) so that gathering from ranks always works."""
        batches = [b for b in batches if len(b)]
        if not batches:
            return Batch()
        tensors = {}
        for key in batches[0].tensors:
            parts = [b.tensors[key] for b in batches]
            if parts[0].dim() > 1:
                width = max(p.shape[-1] for p in parts)
                parts = [torch.nn.functional.pad(p, (0, width - p.shape[-1])) for p in parts]
            tensors[key] = torch.cat(parts, dim=0)
        non_tensors = {
            key: np.concatenate([b.non_tensors[key] for b in batches])
            for key in batches[0].non_tensors
        }
        return Batch(tensors, non_tensors, dict(batches[0].meta))

    def rows(self) -> Iterator[dict[str, Any]]:
        """Non-tensor fields row by row (for reward scoring)."""
        for i in range(len(self)):
            yield {k: v[i] for k, v in self.non_tensors.items()}


def _as_object_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray) and value.dtype == object:
        return value
    array = np.empty(len(value), dtype=object)
    array[:] = list(value)
    return array
