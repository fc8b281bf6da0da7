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
        # torch.tensor copies: numpy arrays that arrive through Ray are read-only
        idx = (
            index.long()
            if isinstance(index, torch.Tensor)
            else torch.tensor(np.asarray(index), dtype=torch.long)
        )
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
    def concat(batches: Sequence[Batch], pad_values: dict[str, int | float] | None = None) -> Batch:
        """Rows of all batches in order (parts without rows are skipped).

        Tensors whose last dimension differs are right-padded to the widest part, with
        ``pad_values[key]`` (default 0: masks and log-probs stay zero on padding). Token-id
        tensors need the tokenizer's pad id: pass ``{"input_ids": pad_id, "responses": pad_id}``.
        Every part must have the same keys: a key missing from some part is an error, not
        silently dropped.
        """
        numbered = [(i, b) for i, b in enumerate(batches) if len(b)]
        if not numbered:
            return Batch()
        _check_same_keys(numbered)
        batches = [b for _, b in numbered]
        pad_values = pad_values or {}
        tensors = {}
        for key in batches[0].tensors:
            parts = [b.tensors[key] for b in batches]
            if parts[0].dim() > 1:
                width = max(p.shape[-1] for p in parts)
                value = pad_values.get(key, 0)
                parts = [
                    torch.nn.functional.pad(p, (0, width - p.shape[-1]), value=value)
                    if p.shape[-1] < width
                    else p
                    for p in parts
                ]
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


def _check_same_keys(numbered: Sequence[tuple[int, Batch]]) -> None:
    """Raise when the parts of a concatenation (``(position, batch)`` pairs) do not hold the same
    tensor and non-tensor keys."""
    first_index, first = numbered[0]
    first_tensors, first_others = set(first.tensors), set(first.non_tensors)
    problems = []
    for i, batch in numbered[1:]:
        tensors, others = set(batch.tensors), set(batch.non_tensors)
        if tensors == first_tensors and others == first_others:
            continue
        missing = sorted((first_tensors | first_others) - (tensors | others))
        extra = sorted((tensors | others) - (first_tensors | first_others))
        moved = sorted((first_tensors & others) | (first_others & tensors))
        details = []
        if missing:
            details.append(f"lacks {missing}")
        if extra:
            details.append(f"has extra {extra}")
        if moved:
            details.append(f"has {moved} as tensor in one part and non-tensor in the other")
        problems.append(f"part {i} " + ", ".join(details))
    if problems:
        raise ValueError(
            f"cannot concatenate batches with different keys: part {first_index} has tensors "
            f"{sorted(first_tensors)} and non-tensors {sorted(first_others)}; "
            + "; ".join(problems)
        )


def _as_object_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray) and value.dtype == object:
        return value
    array = np.empty(len(value), dtype=object)
    array[:] = list(value)
    return array
