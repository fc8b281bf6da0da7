"""Sequence parallelism (megatron-core's ``sequence_parallel``), which the engine uses whenever
tensor parallelism does (TP > 1).

Why always: megatron-core trains MoE layers over tensor-parallel ranks only with it (each TP
rank routes its own slice of the tokens; expert parallelism is carved out of TP x DP), and for
a dense model it computes the same thing as plain tensor parallelism with the norms' and
residual's activations split over the TP ranks instead of replicated, for the same
communication volume (each all-reduce becomes an all-gather plus a reduce-scatter).

What it changes for the engine:

- the sequence dimension megatron-core splits (``[s, b, h]``'s ``s``; a packed row's tokens)
  must be a multiple of TP: :func:`pad_packed` appends the padding as one more sequence of the
  packed row (attention stays inside each sequence, so no real token sees it), and
  :func:`pad_columns` prepends padding columns to padded rows (masked like the prompts' left
  padding); the scored positions keep their places from the end;
- the last stage's hidden states are this rank's slice of the sequence: :func:`full_sequence`
  gathers them before the positions that predict the response are picked;
- weights that every TP rank holds whole but that see only the rank's tokens (the norms, the
  MoE router, the shared expert's gate) get a partial gradient on each rank: megatron-core marks
  them ``sequence_parallel`` and sums them over the TP group (:func:`sum_partial_gradients`,
  with the query/key norms, which see only the rank's heads with or without it);
- megatron-core's local-spec norm (torch's) refuses ``sequence_parallel``: it only lacks that
  mark, so :func:`norm_class` is torch's RMSNorm with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cache
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from polyrl_engine_kit.packing import PackedRows


def padding_for(length: int, multiple: int) -> int:
    """Tokens to add to ``length`` for a multiple of ``multiple``."""
    return -length % multiple


def pad_packed(packed: PackedRows, multiple: int) -> PackedRows:
    """``packed`` with its row padded to a multiple of ``multiple`` tokens by one more sequence
    (token 0 at positions 0, 1, ...): the real tokens' attention, positions and scored indices
    are unchanged."""
    extra = padding_for(packed.input_ids.shape[1], multiple)
    if not extra:
        return packed
    cu_seqlens = packed.cu_seqlens
    end = cu_seqlens[-1:] + extra
    positions = torch.arange(extra, device=packed.position_ids.device).unsqueeze(0)
    return dataclasses.replace(
        packed,
        input_ids=F.pad(packed.input_ids, (0, extra)),
        position_ids=torch.cat([packed.position_ids, positions.to(packed.position_ids)], dim=1),
        cu_seqlens=torch.cat([cu_seqlens, end.to(cu_seqlens.dtype)]),
        max_seqlen=max(int(packed.max_seqlen), extra),
    )


def pad_columns(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    multiple: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded rows ``[b, s]`` with padding columns prepended up to a multiple of ``multiple``
    (mask 0, position 0): the columns counted from the end, where the response is, stay put."""
    extra = padding_for(input_ids.shape[1], multiple)
    if not extra:
        return input_ids, position_ids, attention_mask
    return tuple(F.pad(t, (extra, 0)) for t in (input_ids, position_ids, attention_mask))


def full_sequence(hidden: torch.Tensor, group: Any, gradient_is_partial: bool) -> torch.Tensor:
    """The whole sequence ``[s, ...]`` of this TP rank's slice ``hidden`` (collective).
    ``gradient_is_partial``: each rank's gradient of the result covers only its share of the
    scores (its vocabulary slice), so the backward sums them before taking the rank's slice;
    otherwise every rank holds the whole gradient already and takes its slice."""
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    return gather_from_sequence_parallel_region(
        hidden, tensor_parallel_output_grad=gradient_is_partial, group=group
    )


def has_partial_gradient(name: str, param: torch.nn.Parameter) -> bool:
    """Whether each TP rank holds ``param`` whole but computes only part of its gradient
    (megatron-core's rule: marked ``sequence_parallel``, or a query/key norm)."""
    marked = bool(getattr(param, "sequence_parallel", False))
    return marked or name.endswith(("q_layernorm.weight", "k_layernorm.weight"))


def sum_partial_gradients(
    grads: Sequence[torch.Tensor], partial: Sequence[bool], group: Any
) -> None:
    """Sum, over the TP ``group``, the gradients that :func:`has_partial_gradient` marks (in
    place, one flat all-reduce)."""
    chosen = [grad for grad, is_partial in zip(grads, partial) if is_partial]
    if not chosen:
        return
    flat = torch.cat([grad.reshape(-1) for grad in chosen])
    dist.all_reduce(flat, group=group)
    for grad, part in zip(chosen, flat.split([grad.numel() for grad in chosen])):
        grad.copy_(part.view_as(grad))


@cache
def norm_class() -> type:
    """megatron-core's norm interface (``(config, hidden_size, eps)``) as torch's RMSNorm whose
    weight carries megatron-core's ``sequence_parallel`` mark (a class built on first use:
    importing megatron-core takes seconds)."""

    class SequenceParallelRMSNorm(torch.nn.RMSNorm):
        def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
            super().__init__(hidden_size, eps=eps)
            self.weight.sequence_parallel = bool(config.sequence_parallel)

    return SequenceParallelRMSNorm
