"""Ulysses sequence parallelism (DeepSpeed-Ulysses, verl's ``ulysses_sequence_parallel_size``)
for packed rows (:mod:`.packing`).

Why: one long sequence's activations may not fit one device. The ``size`` ranks of a
sequence-parallel group receive the same rows; each feeds the model one contiguous slice of the
packed row (padded to a multiple of ``size``), so every layer but attention runs on a slice.
Around attention, an all-to-all turns each rank's ``[slice, all heads]`` into ``[whole row,
heads / size]`` and another turns the result back, so each rank attends over the whole row for
its share of the heads. Positions and sequence boundaries are those of the whole row, so the
rotary embedding and the causal mask see what the unsplit forward sees.

Each rank scores the response tokens of its slice; :func:`gather_scores` joins them, so the
loss sees whole sequences, identical on every rank of the group. The groups are consecutive
ranks (rank ``r`` is in group ``r // size``), the layout
:func:`polyrl.api.tensor_parallel_mesh` reports to the driver, so that the peers get the same
rows. FSDP still shards over every rank of the world.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from polyrl_engine_kit.packed_attention import packed_attention_forward
from polyrl_engine_kit.packing import PackedRows

ULYSSES_ATTENTION = "polyrl_packed_ulysses"


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's sequence-parallel group: ``size`` ranks, this one at ``rank`` in it."""

    group: Any  # torch.distributed.ProcessGroup
    rank: int
    size: int


# One group per (default process group, size): the actor's and the reference's engines of one
# worker share it, and a test that makes a new default group gets new subgroups.
_GROUPS: dict[int, tuple[Any, SequenceParallel]] = {}


def sequence_parallel_group(size: int, device: torch.device) -> SequenceParallel | None:
    """The group of ``size`` consecutive ranks this rank belongs to (collective the first time:
    every rank must ask for the same sizes in the same order); None for ``size`` 1. ``size``
    must divide the world size."""
    if size == 1:
        return None
    world = dist.get_world_size()
    cached = _GROUPS.get(size)
    if cached is not None and cached[0] is dist.group.WORLD:
        return cached[1]
    mesh = init_device_mesh(device.type, (world // size, size), mesh_dim_names=("dp", "sp"))
    group = mesh.get_group("sp")
    found = SequenceParallel(group=group, rank=dist.get_rank(group), size=size)
    _GROUPS[size] = (dist.group.WORLD, found)
    return found


# ---- collectives with gradients ---------------------------------------------------------------
def _all_to_all(x: torch.Tensor, sp: SequenceParallel, scatter: int, gather: int) -> torch.Tensor:
    """Chunk ``i`` of ``x`` along ``scatter`` goes to rank ``i``; what arrives is joined along
    ``gather`` in rank order."""
    sent = [chunk.contiguous() for chunk in x.chunk(sp.size, dim=scatter)]
    received = [torch.empty_like(chunk) for chunk in sent]
    dist.all_to_all(received, sent, group=sp.group)
    return torch.cat(received, dim=gather)


class _AllToAll(torch.autograd.Function):
    """:func:`_all_to_all`, whose gradient is the all-to-all the other way round."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, sp: SequenceParallel, scatter: int, gather: int
    ) -> torch.Tensor:
        ctx.sp, ctx.dims = sp, (scatter, gather)
        return _all_to_all(x, sp, scatter, gather)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter, gather = ctx.dims
        return _all_to_all(grad, ctx.sp, gather, scatter), None, None, None


def all_to_all(x: torch.Tensor, sp: SequenceParallel, scatter: int, gather: int) -> torch.Tensor:
    return _AllToAll.apply(x, sp, scatter, gather)


class _GatherScores(torch.autograd.Function):
    """Join each rank's scores ``[m_r, ...]`` into ``[sum m_r, ...]`` in rank order.

    The gradient of a rank's part is its slice of the incoming gradient times the group size:
    every rank of the group computes the same loss from the same joined scores, so the
    group's ranks together hold one loss's gradient, summed over their slices; FSDP averages
    gradients over all ranks of the world, the group's peers included, and the factor keeps
    that average equal to the one of data-parallel training without sequence parallelism.
    """

    @staticmethod
    def forward(
        ctx: Any, local: torch.Tensor, sp: SequenceParallel, counts: list[int]
    ) -> torch.Tensor:
        ctx.sp, ctx.counts = sp, counts
        width = max(max(counts), 1)
        padded = F.pad(local, (*([0, 0] * (local.dim() - 1)), 0, width - local.shape[0]))
        parts = [torch.empty_like(padded) for _ in range(sp.size)]
        dist.all_gather(parts, padded.contiguous(), group=sp.group)
        return torch.cat([part[:count] for part, count in zip(parts, counts)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        start = sum(ctx.counts[: ctx.sp.rank])
        mine = grad[start : start + ctx.counts[ctx.sp.rank]]
        return mine * ctx.sp.size, None, None


def gather_scores(local: torch.Tensor, sp: SequenceParallel, counts: list[int]) -> torch.Tensor:
    """The whole row's scores from each rank's ``counts[r]`` (see :func:`shard_packed`)."""
    return _GatherScores.apply(local, sp, counts)


# ---- the packed row, split --------------------------------------------------------------------
def shard_packed(packed: PackedRows, sp: SequenceParallel) -> tuple[PackedRows, list[int]]:
    """This rank's slice of ``packed``, and how many response tokens each rank's slice scores.

    The row is padded to a multiple of the group size with one extra sequence (token 0,
    positions from 0), so the real sequences' attention never reaches the padding. The slice
    keeps the whole row's sequence boundaries (attention runs over the whole row) and scores
    the response tokens whose predicting position lies in it (``score_index`` local to the
    slice, in the whole row's order, so that :func:`gather_scores` restores it).
    """
    total = packed.input_ids.shape[1]
    width = -(-total // sp.size)
    pad = width * sp.size - total
    input_ids = F.pad(packed.input_ids, (0, pad))
    positions = torch.arange(pad).to(packed.position_ids)
    position_ids = torch.cat([packed.position_ids, positions.unsqueeze(0)], dim=1)
    cu_seqlens = packed.cu_seqlens
    if pad:
        cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([total + pad])])
    owner = torch.div(packed.score_index, width, rounding_mode="floor")
    counts = torch.bincount(owner, minlength=sp.size).tolist()
    mine = owner == sp.rank
    start = sp.rank * width
    local = replace(
        packed,
        input_ids=input_ids[:, start : start + width],
        position_ids=position_ids[:, start : start + width],
        cu_seqlens=cu_seqlens,
        max_seqlen=max(packed.max_seqlen, pad),
        score_index=packed.score_index[mine] - start,
        labels=packed.labels[mine],
    )
    return local, counts


# ---- attention --------------------------------------------------------------------------------
def ulysses_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    sequence_parallel: SequenceParallel,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract (``[1, H, slice, D]`` in, ``[1, slice, H, D]``
    out): :func:`~polyrl_engine_kit.packed_attention.packed_attention_forward` on the whole row
    for this rank's share of the heads, between two all-to-alls. Registered outside
    torch.compile's graphs (:func:`use_ulysses_attention`): the collectives run eagerly between
    them. Fewer key/value heads than ranks are repeated to one per rank (each query head keeps
    its own key/value head)."""
    sp = sequence_parallel
    if key.shape[1] < sp.size:
        repeat = sp.size // key.shape[1]
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    # [1, heads, slice, D] -> [1, heads / size, whole row, D]
    q, k, v = (all_to_all(t, sp, 1, 2) for t in (query, key, value))
    out, _ = packed_attention_forward(module, q, k, v, attention_mask, **kwargs)
    # [1, whole row, heads / size, D] -> [1, slice, heads, D]
    return all_to_all(out, sp, 1, 2), None


def use_ulysses_attention(model: Any, sp: SequenceParallel) -> None:
    """Register :func:`ulysses_attention_forward` for ``sp``'s group size with transformers and
    switch ``model`` to it (the packed attention's place, :mod:`.packed_attention`)."""
    from transformers import AttentionInterface

    name = f"{ULYSSES_ATTENTION}_{sp.size}"
    # compiler-disabled here rather than at import: torch.compiler.disable imports dynamo,
    # which every process importing an engine would otherwise pay for
    forward = torch.compiler.disable(ulysses_attention_forward)
    AttentionInterface.register(name, functools.partial(forward, sequence_parallel=sp))
    model.set_attn_implementation(name)
