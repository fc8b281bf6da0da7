"""Padding-free packing: a micro-batch's real tokens laid end to end in one row.

Why: rows are ``[left-padded prompt | right-padded response]``, and the padded layout spends
matmul FLOPs and memory on padding that differs from row to row (short and long responses
share a micro-batch). Packed, a micro-batch costs exactly its real tokens; attention is kept
inside each sequence by the cumulative lengths ``cu_seqlens`` (see :mod:`.packed_attention`),
and positions restart at 0 with every sequence (the rotary embedding reads them).

Each row's real tokens must be contiguous (prompt then response, as the rollout writes them).
The scores of a response token come from the position just before it, so we keep the packed
index of that position for every real response token (``score_index``) and scatter the scores
back into the ``[b, R]`` layout afterwards (:func:`unpack`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PackedRows:
    """One micro-batch packed into a single row, and the way back to ``[b, R]``."""

    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T], restarting at 0 with each sequence
    cu_seqlens: torch.Tensor  # [n + 1] int32, sequence boundaries in the packed row
    max_seqlen: int
    score_index: torch.Tensor  # [M] packed positions that predict the real response tokens
    labels: torch.Tensor  # [M] the real response tokens
    response_real: torch.Tensor  # [b, R] bool, where the M scores go back


def pack_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int
) -> PackedRows:
    """Pack the rows of ``input_ids`` ``[b, P+R]`` whose real tokens ``attention_mask`` marks.

    Positions are counted over the real tokens of each row (0 at the first), as generation
    counts them, so a packed forward sees the same positions as the padded one.
    """
    real = attention_mask.bool()
    lengths = real.sum(dim=1)
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    flat_real = real.flatten()
    packed_index = (flat_real.cumsum(0) - 1).view_as(real)  # where each real token lands
    positions = (real.long().cumsum(dim=1) - 1)[real]
    response_real = real[:, -response_width:]
    return PackedRows(
        input_ids=input_ids.flatten()[flat_real].unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        cu_seqlens=cu_seqlens,
        max_seqlen=int(lengths.max()) if lengths.numel() else 0,
        score_index=packed_index[:, -response_width:][response_real] - 1,
        labels=input_ids[:, -response_width:][response_real],
        response_real=response_real,
    )


def unpack(scores: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """Scores ``[M]`` of the real response tokens back to ``[b, R]``, zero on padding."""
    out = scores.new_zeros(packed.response_real.shape)
    return out.masked_scatter(packed.response_real, scores)


def to_device(packed: PackedRows, device: torch.device) -> PackedRows:
    """``packed`` with its tensors on ``device``, copied without waiting for the device.

    Why: packing on the host and copying the result (``non_blocking``: a copy from pageable
    host memory is staged at once, with no device synchronisation) leaves the host free to
    launch the next micro-batch while the device still runs the last one; packing on the
    device instead reads lengths and masks back (boolean indexing, the longest sequence),
    which waits for every kernel queued before it."""
    moved = {
        f.name: getattr(packed, f.name).to(device, non_blocking=True)
        for f in fields(packed)
        if isinstance(getattr(packed, f.name), torch.Tensor)
    }
    return replace(packed, **moved)
