"""The attention of the Megatron engine's layers: the rotary embedding at each token's own
position, then megatron-core's local ``DotProductAttention`` computed by torch's fused kernels,
over padded rows or one packed row.

Why the rotary embedding is applied here and not by megatron-core: megatron-core's RoPE numbers
positions ``0..s-1`` along the micro-batch's columns, and for packed sequences (its ``thd``
format) it splits the row into its sequences and rotates each on its own, with a host sync and a
handful of kernels per sequence and layer (a 16k-token micro-batch holds ~60 sequences). The
engine builds the model without position embeddings and passes every token's HF position, with
the cosines and sines computed once per micro-batch (:func:`padded_layout`,
:func:`packed_layout`); each layer then rotates its queries and keys in two element-wise
kernels, in float32 as the HF model does under autocast (its tables are float32).

Why SDPA for padded rows: the local layer spec materialises every layer's ``[b, heads, s, s]``
scores, masks them and runs the softmax as separate kernels, and keeps the probabilities for the
backward. SDPA computes the same softmax(QK^T / sqrt(d) + mask) V in one fused kernel and
recomputes what it needs in its backward. The mask is megatron-core's (True where a query may
not attend). A row with no key left would make SDPA's softmax NaN, which then reaches the values
of every query through a zero weight, so the engine lets each position attend to itself
(:func:`attention_mask`): only padding queries need it, and their outputs are never read.

A packed row (padding-free, the micro-batch's real tokens end to end) needs no mask: the
sequences' boundaries go to torch's variable-length flash attention, which skips every
cross-sequence block (:func:`polyrl_engine_kit.packed_attention.causal_packed_attention`).

With context parallelism (:mod:`.context_parallel`) the layout also carries the gather of the
group's keys and values: padded rows' mask is then this rank's query rows over the gathered
columns, and a packed row's query segments (chunks of sequences) each attend over the keys of
their sequence up to their end.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

from polyrl_engine_kit.packed_attention import causal_packed_attention
from polyrl_engine_kit.packing import PackedRows
from polyrl_engine_megatron.context_parallel import KeyValueGather, PackedSplit


def attention_mask(padding: torch.Tensor) -> torch.Tensor:
    """megatron-core's boolean mask ``[b, 1, s, s]`` from polyrl's ``[b, s]`` padding mask (1 on
    tokens): True where a query may NOT attend, i.e. future positions and padding keys, except
    its own position (so that a padding query's row is not empty)."""
    width = padding.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool, device=padding.device).tril()
    allowed = causal.unsqueeze(0) & padding.bool().unsqueeze(1)
    allowed |= torch.eye(width, dtype=torch.bool, device=padding.device)
    return ~allowed.unsqueeze(1)


def rotary_tables(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cosines and sines ``positions.shape + (head_dim,)`` of the HF (Llama/Qwen2)
    rotary embedding, in its rotate-half layout (each frequency twice, halves concatenated)."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = 1.0 / (theta ** (exponents / head_dim))
    angles = positions.float().unsqueeze(-1) * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` in float32, returned in ``dtype`` (``x``'s by
    default)."""
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat((-second, first), dim=-1) * sin).to(dtype or x.dtype)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype attention runs in: autocast's where it is on, else ``x``'s. Measured on the
    H200: under a bf16 autocast the queries reach megatron-core's core attention in float32,
    and flash varlen takes no float32 (every packed sequence then ran SDPA's math kernel with
    float32 GEMMs: 7.4 s instead of 0.92 s for the 0.5B update)."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


@cache
def sequence_layout_class() -> type:
    """megatron-core's ``PackedSeqParams`` with the rotary tables added (a class built on first
    use: importing megatron-core takes seconds and needs the plugin's extra). megatron-core
    passes it untouched to every layer's core attention; ``qkv_format="thd"`` (packed) makes it
    squeeze the batch dimension away around the core attention."""
    from megatron.core.packed_seq_params import PackedSeqParams

    @dataclass
    class SequenceLayout(PackedSeqParams):
        rope_cos: torch.Tensor | None = None
        rope_sin: torch.Tensor | None = None
        # context parallelism: the keys and values this rank's queries attend over
        key_values: KeyValueGather | None = None

    return SequenceLayout


def padded_layout(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    key_values: KeyValueGather | None = None,
) -> Any:
    """The layout of padded rows ``[b, s]`` with these positions (tables ``[s, b, 1, d]``, as
    megatron-core's ``[s, b, heads, d]`` queries); ``key_values``: under context parallelism,
    the gather of the group's keys and values (their columns in gathered order)."""
    cos, sin = rotary_tables(positions.transpose(0, 1).unsqueeze(2), head_dim, theta)
    return sequence_layout_class()(
        qkv_format="sbhd", rope_cos=cos, rope_sin=sin, key_values=key_values
    )


def packed_layout(packed: PackedRows, head_dim: int, theta: float) -> Any:
    """The layout of one packed row (tables ``[T, 1, d]``, as the ``[T, heads, d]`` queries)."""
    return _thd_layout(
        packed.position_ids[0], head_dim, theta, packed.cu_seqlens, packed.max_seqlen
    )


def context_packed_layout(split: PackedSplit, head_dim: int, theta: float, group: Any) -> Any:
    """The layout of this rank's share of a packed row under context parallelism
    (:meth:`.context_parallel.ContextParallel.split_packed`): its query segments, and for each
    the group's keys up to the segment's end."""
    return _thd_layout(
        split.positions,
        head_dim,
        theta,
        split.cu_seqlens_q,
        split.max_seqlen_q,
        keys=(split.cu_seqlens_kv, split.max_seqlen_kv),
        key_values=KeyValueGather(group, split.key_index),
    )


def _thd_layout(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    keys: tuple[torch.Tensor, int] | None = None,
    key_values: KeyValueGather | None = None,
) -> Any:
    cos, sin = rotary_tables(positions.unsqueeze(1), head_dim, theta)
    cu_keys, max_keys = keys if keys is not None else (cu_seqlens, max_seqlen)
    return sequence_layout_class()(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_keys,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_keys,
        rope_cos=cos,
        rope_sin=sin,
        key_values=key_values,
    )


@cache
def sdpa_core_attention() -> type:
    """``DotProductAttention`` with the rotary embedding and its forward computed by SDPA or
    flash varlen (a class built on first use, as :func:`sequence_layout_class`)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class ScaledDotProductAttention(DotProductAttention):
        """Same constructor, parameters and shapes as megatron-core's local core attention."""

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type: Any = None,
            attention_bias: Any = None,
            packed_seq_params: Any = None,
        ) -> torch.Tensor:
            """Padded: ``[s, b, heads, d]`` queries, ``[s, b, groups, d]`` keys and values, the
            mask of :func:`attention_mask`, ``[s, b, heads x d]`` out. Packed: ``[T, heads, d]``
            and ``[T, groups, d]``, no mask, ``[T, heads x d]`` out. Either with the layout of
            :func:`padded_layout` or :func:`packed_layout` (:func:`context_packed_layout`), whose
            ``key_values`` under context parallelism gathers the keys and values this rank's
            queries attend over (the padded mask then this rank's rows of the gathered
            columns')."""
            layout = packed_seq_params
            packed = layout is not None and layout.qkv_format == "thd"
            if (
                getattr(layout, "rope_cos", None) is None
                or attention_bias is not None
                or (attention_mask is None) != packed
            ):
                raise ValueError(
                    "polyrl's core attention takes the engine's sequence layout "
                    "(padded_layout() with attention_mask(), or packed_layout() without a mask) "
                    "and no attention bias"
                )
            dtype = compute_dtype(query)
            query = rotate(query, layout.rope_cos, layout.rope_sin, dtype)
            key = rotate(key, layout.rope_cos, layout.rope_sin, dtype)
            value = value.to(dtype)
            if layout.key_values is not None:
                key, value = layout.key_values(key, value)
            if packed:
                context = causal_packed_attention(
                    query,
                    key,
                    value,
                    layout.cu_seqlens_q,
                    int(layout.max_seqlen_q),
                    self.softmax_scale,
                    keys=(layout.cu_seqlens_kv, int(layout.max_seqlen_kv)),
                )
                return context.reshape(context.shape[0], -1)
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, n, s, d]
            groups = q.shape[1] // k.shape[1]
            if groups > 1:
                k = k.repeat_interleave(groups, dim=1)
                v = v.repeat_interleave(groups, dim=1)
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=~attention_mask, scale=self.softmax_scale
            )
            seq, batch = query.shape[0], query.shape[1]
            return context.permute(2, 0, 1, 3).reshape(seq, batch, -1)

    return ScaledDotProductAttention
