"""Context parallelism (verl's ``megatron.context_parallel_size``): the ranks of a context-parallel
group share each micro-batch's tokens, every rank running the model on its share.

Why the engine's own and not megatron-core's: megatron-core's context parallelism lives in
Transformer Engine's attention, which the engine does not use (:mod:`.attention`). Everything but
attention works on tokens one at a time, so only attention needs the other ranks' tokens: each
layer all-gathers the keys and values of the group (already rotated, at each token's own HF
position) and attends from its own queries under the causal (and, for a packed row,
per-sequence) mask of the tokens' true places. The all-gather's backward sums every rank's
gradient of the gathered keys and values back onto the rank that holds them.

The split is megatron's load-balanced one: a token axis (padded rows' columns, or each sequence
of a packed row) is padded to a multiple of ``2 x size`` and cut into ``2 x size`` chunks; rank
``r`` holds chunks ``r`` and ``2 x size - 1 - r``, so every rank gets as much causal attention
work as the others. The padding tokens sit at the end of their axis (after every real token of a
sequence), so causally no real token sees them.

After the last layer each rank scores the response positions it holds; the scores are summed
over the group into every rank's ``[..., scored positions]`` tensor (:func:`sum_replicated`), so
the loss and everything downstream see the whole micro-batch, as without context parallelism.
Every rank then computes the same loss, so each rank's share of its gradient is the gradient
itself (no collective in the backward), and the weights' gradients, each rank's share of the
whole, are summed over the group with the data-parallel reduction (:mod:`.gradients`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class _GatherTokens(torch.autograd.Function):
    """All-gather along dim 0 over the group; backward: the sum of every rank's gradient of the
    gathered tensor, this rank's part of it."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        size = dist.get_world_size(group)
        gathered = local.new_empty((size * local.shape[0], *local.shape[1:]))
        dist.all_gather_into_tensor(gathered, local.contiguous(), group=group)
        return gathered

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        size = dist.get_world_size(ctx.group)
        local = grad.new_empty((grad.shape[0] // size, *grad.shape[1:]))
        dist.reduce_scatter_tensor(local, grad.contiguous(), group=ctx.group)
        return local, None


class _SumReplicated(torch.autograd.Function):
    """All-reduce (sum) whose result feeds the same computation on every rank: the gradient of
    each rank's addend is the gradient of the sum, unchanged."""

    @staticmethod
    def forward(ctx: Any, part: torch.Tensor, group: Any) -> torch.Tensor:
        total = part.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def gather_tokens(local: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's ``local`` ``[n, ...]`` end to end, rank by rank (autograd)."""
    return _GatherTokens.apply(local, group)


def sum_replicated(part: torch.Tensor, group: Any) -> torch.Tensor:
    """The sum of every rank's ``part``, for a loss every rank computes alike (autograd)."""
    return _SumReplicated.apply(part, group)


def balanced_chunks(length: int, size: int, rank: int) -> torch.Tensor:
    """The positions of an axis of ``length`` (a multiple of ``2 x size``) that ``rank`` holds:
    chunks ``rank`` and ``2 x size - 1 - rank`` of ``2 x size``."""
    chunk = length // (2 * size)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    second = torch.arange((2 * size - 1 - rank) * chunk, (2 * size - rank) * chunk)
    return torch.cat((first, second))


def padded_length(length: int, step: int) -> int:
    """``length`` rounded up to a multiple of ``step``."""
    return -(-length // step) * step


@dataclass(frozen=True)
class KeyValueGather:
    """What a layer's attention does with its keys and values under context parallelism: gather
    them over ``group`` (rank by rank), then, for a packed row, pick each query segment's keys
    (``index`` into the gathered tokens; None: all of them, in gathered order)."""

    group: Any
    index: torch.Tensor | None = None

    def __call__(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[s, ...]`` keys and values of this rank's tokens -> those its queries attend over."""
        both = gather_tokens(torch.cat((key, value), dim=-2), self.group)
        if self.index is not None:
            both = both.index_select(0, self.index)
        return both.split((key.shape[-2], value.shape[-2]), dim=-2)


@dataclass(frozen=True)
class PaddedSplit:
    """Padded rows' columns (``width``, padded to ``padded``): this rank's (``local``) and every
    rank's in the order the all-gather returns them (``gathered``)."""

    width: int
    padded: int
    local: torch.Tensor
    gathered: torch.Tensor

    def pad(self, columns: torch.Tensor, value: int = 0) -> torch.Tensor:
        """``[b, width]`` -> this rank's ``[b, local]``, the padding columns ``value``."""
        full = torch.nn.functional.pad(columns, (0, self.padded - self.width), value=value)
        return full[:, self.local]


@dataclass(frozen=True)
class PackedSplit:
    """A packed row, each sequence padded to a multiple of ``2 x size``: where each real token
    lands (``real``), this rank's tokens (``local``), their HF positions, and the attention
    layout: query segments (two chunks of each sequence) and the keys each attends over (the
    sequence up to the chunk's end), as indices into the gathered tokens."""

    padded: int
    real: torch.Tensor
    local: torch.Tensor
    positions: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    max_seqlen_q: int
    max_seqlen_kv: int
    key_index: torch.Tensor


@dataclass(frozen=True)
class ScoreShare:
    """This rank's part of a micro-batch's scored positions: its token rows (``rows``, into its
    local tokens) and their places (``slots``) among ``count`` scored positions.

    A rank that holds no scored position scores its first token as slot 0, times zero
    (``empty``): its loss must still depend on its every layer, or its backward would skip the
    key/value gathers its peers' backwards wait on."""

    rows: torch.Tensor
    slots: torch.Tensor
    count: int
    group: Any
    empty: bool = False

    def spread(self, scores: torch.Tensor) -> torch.Tensor:
        """``[..., rows]`` scores of this rank -> ``[..., count]`` scores of the whole group."""
        part = scores.new_zeros((*scores.shape[:-1], self.count))
        part = part.index_copy(-1, self.slots, scores * 0 if self.empty else scores)
        return sum_replicated(part, self.group)


@dataclass(frozen=True)
class ContextParallel:
    """This rank's place in its context-parallel group."""

    group: Any
    size: int
    rank: int
    device: torch.device

    def split_padded(self, width: int, multiple: int = 1) -> PaddedSplit:
        """The split of padded rows ``width`` columns wide (indices on ``device``), each chunk a
        multiple of ``multiple`` columns (sequence parallelism splits a rank's tokens over
        TP)."""
        padded = padded_length(width, 2 * self.size * multiple)
        chunks = [balanced_chunks(padded, self.size, rank) for rank in range(self.size)]
        return PaddedSplit(
            width, padded, chunks[self.rank].to(self.device), torch.cat(chunks).to(self.device)
        )

    def split_packed(self, cu_seqlens: torch.Tensor, multiple: int = 1) -> PackedSplit:
        """The split of a packed row with these sequence boundaries (read on the host; indices
        on ``device``), each chunk a multiple of ``multiple`` tokens."""
        bounds = cu_seqlens.tolist()
        lengths = [stop - start for start, stop in itertools.pairwise(bounds)]
        padded = [padded_length(length, 2 * self.size * multiple) for length in lengths]
        starts = [0, *itertools.accumulate(padded)][:-1]
        real = torch.cat([start + torch.arange(n) for start, n in zip(starts, lengths)])
        positions = torch.cat([torch.arange(length) for length in padded])

        def segments(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            """Rank's query segments: each chunk's tokens and the keys it attends over."""
            out = []
            for start, length in zip(starts, padded):
                chunk = length // (2 * self.size)
                for index in (rank, 2 * self.size - 1 - rank):
                    tokens = start + torch.arange(index * chunk, (index + 1) * chunk)
                    out.append((tokens, start + torch.arange((index + 1) * chunk)))
            return out

        every = [segments(rank) for rank in range(self.size)]
        gathered = torch.cat([tokens for held in every for tokens, _ in held])
        place = torch.empty(sum(padded), dtype=torch.long)
        place[gathered] = torch.arange(len(gathered))
        own = every[self.rank]
        local = torch.cat([tokens for tokens, _ in own])
        query = [len(tokens) for tokens, _ in own]
        keys = [len(key) for _, key in own]
        return PackedSplit(
            padded=sum(padded),
            real=real.to(self.device),
            local=local.to(self.device),
            positions=positions[local].to(self.device),
            cu_seqlens_q=_boundaries(query).to(self.device),
            cu_seqlens_kv=_boundaries(keys).to(self.device),
            max_seqlen_q=max(query),
            max_seqlen_kv=max(keys),
            key_index=place[torch.cat([key for _, key in own])].to(self.device),
        )

    def share(self, slots: torch.Tensor, count: int) -> ScoreShare:
        """The scored positions among this rank's tokens: ``slots[i]`` is the place of this
        rank's token ``i`` among ``count`` scored ones, negative where it is not scored."""
        rows = (slots >= 0).nonzero().squeeze(1)
        if len(rows) == 0:
            first = torch.zeros(1, dtype=torch.long, device=slots.device)
            return ScoreShare(first, first, count, self.group, empty=True)
        return ScoreShare(rows, slots[rows], count, self.group)


def _boundaries(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
