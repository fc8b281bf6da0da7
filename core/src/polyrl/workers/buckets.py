"""Named tensors packed into flat byte buckets of bounded size, and unpacked again.

Why buckets: moving a model between processes one tensor at a time costs one collective per
tensor (hundreds of small ones), and moving it in one piece needs a second full copy of the
model in memory. A bucket is one flat ``uint8`` buffer of at most ``max_bytes`` plus the entries
that say which bytes belong to which tensor. A tensor larger than a bucket is cut into chunks
over consecutive buckets, so the bound holds for every bucket whatever the model; the receiver
reassembles it (the one full tensor it has to hold anyway, to load it).

Packing is lazy (:func:`pack_buckets` holds one bucket at a time) and byte-exact for every
dtype (bool, 8-bit, bf16, fp64, 0-d and empty tensors included): tensors are reinterpreted as
bytes, never converted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch

# Every tensor's bytes start at a multiple of this offset in its bucket, so a slice of the
# buffer can be viewed as any dtype (a view needs its offset aligned to the element size).
ALIGN = 16


class Entry(NamedTuple):
    """One tensor's chunk in a bucket: ``length`` bytes at ``offset`` of the bucket are bytes
    ``start .. start + length`` of the tensor ``name`` (``nbytes`` in all)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    start: int
    length: int
    offset: int


class Bucket(NamedTuple):
    entries: list[Entry]
    buffer: torch.Tensor  # uint8, 1-d


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=flat.device)
    return flat.view(torch.uint8)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pack_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], max_bytes: int
) -> Iterator[Bucket]:
    """The stream as buckets of at most ``max_bytes`` (>= :data:`ALIGN`) each, in order; a
    bucket's buffer lives on the device of its tensors."""
    if max_bytes < ALIGN:
        raise ValueError(f"a bucket needs at least {ALIGN} bytes, got {max_bytes}")
    entries: list[Entry] = []
    parts: list[tuple[int, torch.Tensor]] = []
    used = 0

    def flush() -> Bucket:
        nonlocal entries, parts, used
        device = parts[0][1].device if parts else torch.device("cpu")
        buffer = torch.empty(used, dtype=torch.uint8, device=device)
        for offset, data in parts:
            buffer[offset : offset + data.numel()].copy_(data)
        bucket = Bucket(entries, buffer)
        entries, parts, used = [], [], 0
        return bucket

    for name, tensor in named_tensors:
        data = _as_bytes(tensor)
        nbytes = data.numel()
        meta = (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), nbytes)
        start = 0
        while True:
            offset = _aligned(used)
            # a tensor that fits a bucket is not cut: it starts the next one instead
            whole_fits_next = start == 0 and nbytes <= max_bytes
            if entries and (
                offset >= max_bytes or (whole_fits_next and offset + nbytes > max_bytes)
            ):
                yield flush()
                offset = 0
            length = min(nbytes - start, max_bytes - offset)
            entries.append(Entry(*meta, start, length, offset))
            parts.append((offset, data[start : start + length]))
            used = offset + length
            start += length
            if start >= nbytes:
                break
    if entries:
        yield flush()


def unpack_buckets(buckets: Iterable[Bucket]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs back from :func:`pack_buckets`' buckets, each as soon as its
    last chunk arrived. A tensor that fits one bucket is a view of that bucket's buffer; the
    caller copies it before the buffer is reused."""
    pending: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        for entry in bucket.entries:
            chunk = bucket.buffer[entry.offset : entry.offset + entry.length]
            if entry.start == 0 and entry.length == entry.nbytes:
                yield entry.name, _from_bytes(chunk, entry)
                continue
            whole = pending.get(entry.name)
            if whole is None:
                whole = pending[entry.name] = torch.empty(
                    entry.nbytes, dtype=torch.uint8, device=chunk.device
                )
            whole[entry.start : entry.start + entry.length].copy_(chunk)
            if entry.start + entry.length == entry.nbytes:
                yield entry.name, _from_bytes(pending.pop(entry.name), entry)
    if pending:
        raise ValueError(f"the bucket stream ended inside the tensors {sorted(pending)}")


def _from_bytes(data: torch.Tensor, entry: Entry) -> torch.Tensor:
    dtype = getattr(torch, entry.dtype)
    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=dtype, device=data.device)
    return data.view(dtype).reshape(entry.shape)
