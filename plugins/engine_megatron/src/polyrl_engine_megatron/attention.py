"""The core attention of the Megatron engine's layers: megatron-core's local ``DotProductAttention``
computed by torch's ``scaled_dot_product_attention``.

Why: the local layer spec (the one that needs no Transformer Engine) materialises every
layer's ``[b, heads, s, s]`` scores, masks them and runs the softmax as separate kernels, and keeps
the probabilities for the backward. SDPA computes the same softmax(QK^T / sqrt(d) + mask) V in
one fused kernel (on CUDA the memory-efficient one, which takes polyrl's boolean padding mask)
and recomputes what it needs in its backward.

The mask is megatron-core's (True where a query may not attend). A row with no key left would
make SDPA's softmax NaN, which then reaches the values of every query through a zero weight, so
the engine lets each position attend to itself (:func:`attention_mask`): only padding queries
need it, and their outputs are never read.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
import torch.nn.functional as F


def attention_mask(padding: torch.Tensor) -> torch.Tensor:
    """megatron-core's boolean mask ``[b, 1, s, s]`` from polyrl's ``[b, s]`` padding mask (1 on
    tokens): True where a query may NOT attend, i.e. future positions and padding keys, except
    its own position (so that a padding query's row is not empty)."""
    width = padding.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool, device=padding.device).tril()
    allowed = causal.unsqueeze(0) & padding.bool().unsqueeze(1)
    allowed |= torch.eye(width, dtype=torch.bool, device=padding.device)
    return ~allowed.unsqueeze(1)


@cache
def sdpa_core_attention() -> type:
    """``DotProductAttention`` with its forward computed by SDPA (a class built on first use:
    importing megatron-core takes seconds and needs the plugin's extra)."""
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
            """``[s, b, heads, d]`` queries and ``[s, b, groups, d]`` keys and values in,
            ``[s, b, heads x d]`` out."""
            if attention_mask is None or attention_bias is not None or packed_seq_params:
                raise ValueError(
                    "polyrl's SDPA core attention takes a padding mask (attention_mask()) and "
                    "no attention bias or packed-sequence parameters"
                )
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
