"""Attention for packed rows (:mod:`.packing`): causal inside each sequence, never across.

Why a registered attention function: transformers' own ``sdpa`` path turns packed position ids
into a block-diagonal ``[T, T]`` mask, and a masked SDPA runs the quadratic kernel over the whole
row (a 16k-token micro-batch of 300-token sequences does ~50x the attention work it needs). On
CUDA we call torch's variable-length flash attention (``torch.nn.attention.varlen``) with the
sequence boundaries, which skips the cross-sequence blocks; elsewhere (CPU tests, or a torch
without it) each sequence runs through causal SDPA on its own slice, which is exact and cheap
at test sizes. The boundaries reach this function as the ``cu_seq_lens_q`` / ``max_length_q``
keyword arguments, which transformers' models pass through to the attention function.

A row passed without boundaries (the engine's 2-token dummy pass) is one causal sequence.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import torch
import torch.nn.functional as F

PACKED_ATTENTION = "polyrl_packed"


def _varlen() -> tuple[Any | None, dict[str, Any], bool]:
    """torch's varlen flash attention (None where this torch lacks it or a causal form of it),
    the keyword arguments that make it causal, and whether it takes fewer key/value heads."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, {}, False
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        return varlen_attn, {"window_size": (-1, 0)}, "enable_gqa" in params
    if "is_causal" in params:
        return varlen_attn, {"is_causal": True}, "enable_gqa" in params
    return None, {}, False


# Looked up once, at import: inside a compiled decoder layer (compiling.py) the attention is
# traced, and signature inspection there would break the graph. Only where CUDA is (the only
# device that calls it): importing it pulls in much of dynamo, a cost every CPU process that
# imports an engine would pay for nothing.
_VARLEN_ATTN, _CAUSAL, _TAKES_GQA = _varlen() if torch.cuda.is_available() else (None, {}, False)


def _varlen_causal(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu: tuple[torch.Tensor, torch.Tensor],
    max_len: tuple[int, int],
    scale: float,
) -> torch.Tensor | None:
    """``[T, H, D]`` flash varlen attention (``cu`` and ``max_len``: the queries' and the keys'
    boundaries and longest segment), or None where this torch lacks a causal form or the dtype
    is not one flash attention takes."""
    if _VARLEN_ATTN is None or query.dtype not in (torch.bfloat16, torch.float16):
        return None
    causal = dict(_CAUSAL)
    if key.shape[1] != query.shape[1]:
        if _TAKES_GQA:
            causal["enable_gqa"] = True
        else:
            repeat = query.shape[1] // key.shape[1]
            key = key.repeat_interleave(repeat, dim=1)
            value = value.repeat_interleave(repeat, dim=1)
    return _VARLEN_ATTN(query, key, value, *cu, *max_len, scale=scale, **causal)


def _per_sequence_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu: tuple[list[int], list[int]],
    scale: float,
) -> torch.Tensor:
    """``[T, H, D]`` queries, ``[T_k, G, D]`` keys and values, the queries' and the keys'
    boundaries; causal SDPA (aligned at the segments' ends) on each segment's slices; ``[T, H,
    D]`` out."""
    outputs = []
    groups = query.shape[1] // key.shape[1]
    for (start, stop), (key_start, key_stop) in zip(
        itertools.pairwise(cu[0]), itertools.pairwise(cu[1]), strict=True
    ):
        q = query[start:stop].transpose(0, 1)
        k = key[key_start:key_stop].transpose(0, 1).repeat_interleave(groups, dim=0)
        v = value[key_start:key_stop].transpose(0, 1).repeat_interleave(groups, dim=0)
        shift = (key_stop - key_start) - (stop - start)
        allowed = None
        if shift:  # is_causal aligns the mask at the start
            allowed = torch.ones(
                (stop - start, key_stop - key_start), dtype=torch.bool, device=q.device
            ).tril(diagonal=shift)
        outputs.append(
            F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, is_causal=not shift, scale=scale
            )
        )
    return torch.cat(outputs, dim=1).transpose(0, 1)


def causal_packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
    keys: tuple[torch.Tensor, int] | None = None,
) -> torch.Tensor:
    """Causal attention inside each sequence of a packed row: ``[T, H, D]`` queries, ``[T, G,
    D]`` keys and values (``G`` divides ``H``), sequence boundaries ``cu_seqlens`` ``[n + 1]``
    (int32); ``[T, H, D]`` out. Flash varlen on CUDA in bf16/fp16, else SDPA per sequence.

    ``keys``: the keys' own boundaries and longest segment where a segment's queries are the
    last of its keys (context parallelism: a chunk of a sequence attends over the sequence up to
    the chunk's end); the causal mask is then aligned at the segments' ends, as flash
    attention aligns it."""
    cu_keys, max_keys = keys if keys is not None else (cu_seqlens, max_seqlen)
    out = None
    if query.is_cuda:
        out = _varlen_causal(
            query, key, value, (cu_seqlens, cu_keys), (max_seqlen, max_keys), scale
        )
    if out is None:
        out = _per_sequence_sdpa(query, key, value, (cu_seqlens.tolist(), cu_keys.tolist()), scale)
    return out


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``[b, H, T, D]`` in, ``[b, T, H, D]`` out."""
    if attention_mask is not None:
        raise ValueError(
            "packed attention got a padding mask: packed rows carry no padding (the engine "
            "passes sequence boundaries instead)"
        )
    batch, _, length, head_dim = query.shape
    scale = scaling if scaling is not None else head_dim**-0.5
    if cu_seq_lens_q is None:
        cu_seq_lens_q = torch.tensor([0, length], dtype=torch.int32, device=query.device)
        max_length_q = length
    if batch != 1:
        raise ValueError(f"packed attention takes one packed row, got {batch}")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
    out = causal_packed_attention(q, k, v, cu_seq_lens_q, int(max_length_q or length), scale)
    return out.unsqueeze(0), None


def use_packed_attention(model: Any) -> None:
    """Register :func:`packed_attention_forward` with transformers and switch ``model`` to it."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)
    model.set_attn_implementation(PACKED_ATTENTION)
