"""A continued prefill (a few new tokens per row after kept KV) written out for Llama-family models.

Why: a multi-turn episode's next turn prefills only its observation, a few dozen tokens a row,
after the KV the prefix cache kept (:mod:`polyrl_rollout_hf.prefix_cache`). At that size the
transformers forward is mostly fixed cost: its 4D-mask construction, a key/value cache that
concatenates past and new keys, the grouped KV heads repeated to every query head before SDPA
(``repeat_kv``: the whole kept KV copied seven times for Qwen2-0.5B), and a gather that lays the
result out as a fresh prefill's. Here the layers run the fused decode step's own per-layer
functions (:attr:`FusedDecodeStep.before`, ``after`` and ``head``: compiled wherever the step is,
so each layer's norms, rotary embedding and gated MLP are a few fused kernels instead of dozens
of eager ones over every new token; their row count is dynamic, so the decode ladder's shapes
and every turn's token count share the compiled graphs) over every new token at once: the new
tokens' keys and values are written straight into the last columns of a cache that already has
the fresh prefill's layout, and attention folds each KV head's query heads and new tokens into
one query axis, so the kept KV is read once and never copied.

The operations and their order are transformers' (as for the decode step); only the batching
of the attention differs, so the results equal the model's own forward up to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from polyrl_rollout_hf.fused_step import FusedDecodeStep, layer_weights


def attention_mask(mask: torch.Tensor, new: int, groups: int) -> torch.Tensor:
    """``[rows, 1, groups * new, W]`` (bool, True = attend) for the last ``new`` columns of a
    right-aligned ``mask [rows, W]`` as queries, each key axis repeated for the ``groups``
    query heads of a KV head: query ``q`` sees the row's real columns up to its own, and its own
    column always (a padding query then attends to something: no row of the softmax is empty)."""
    rows, width = mask.shape
    columns = torch.arange(width, device=mask.device)
    own = torch.arange(width - new, width, device=mask.device).unsqueeze(1)  # [new, 1]
    sees = (mask.bool().unsqueeze(1) & (columns <= own)) | (columns == own)  # [rows, new, W]
    return sees.unsqueeze(1).expand(rows, groups, new, width).reshape(rows, 1, groups * new, width)


@torch.inference_mode()
def continue_prefill(
    step: FusedDecodeStep,
    ids: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor,
    caches: list[tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """The logits ``[rows, V]`` after the last of ``ids [rows, T]``, the tokens of the last
    ``T`` columns of each row's prompt (``mask [rows, W]``, right-aligned) at ``positions
    [rows, T]``. ``caches[i] = (keys, values) [rows, KV, W, D]`` hold the earlier columns' KV of
    layer ``i``; this writes the ``T`` tokens' KV into their last ``T`` columns."""
    rows, new = ids.shape
    body = step.body
    embedded = body.embed_tokens(ids)  # [rows, T, hidden]
    cos, sin = body.rotary_emb(embedded, positions)  # [rows, T, D]
    x = embedded.reshape(rows * new, -1)
    cos, sin = cos.reshape(rows * new, 1, -1), sin.reshape(rows * new, 1, -1)
    step.rows_dynamic(x, cos, sin)
    kv_heads, width, head_dim = caches[0][0].shape[1], mask.shape[1], caches[0][0].shape[3]
    groups = body.config.num_attention_heads // kv_heads
    sees = attention_mask(mask, new, groups)
    layers = zip(body.layers, step.layer_eps, caches, step.merged, strict=True)
    for layer, eps, (keys, values), merged in layers:
        w = layer_weights(layer, merged)
        q, k, v = step.before(x, cos, sin, w, eps, kv_heads, head_dim)
        # [rows * T, KV, (G or 1), D] -> [rows, KV, (G *) T, D]
        keys[:, :, width - new :] = k.reshape(rows, new, kv_heads, head_dim).transpose(1, 2)
        values[:, :, width - new :] = v.reshape(rows, new, kv_heads, head_dim).transpose(1, 2)
        grouped = q.reshape(rows, new, kv_heads, groups, head_dim).permute(0, 2, 3, 1, 4)
        attention = F.scaled_dot_product_attention(
            grouped.reshape(rows, kv_heads, groups * new, head_dim),
            keys,
            values,
            attn_mask=sees,
            scale=step.scaling,
        )
        attention = attention.view(rows, kv_heads, groups, new, head_dim).permute(0, 3, 1, 2, 4)
        attention = attention.reshape(rows * new, -1)
        step.rows_dynamic(attention)
        x = step.after(x, attention, w, eps)
    last = x.view(rows, new, -1)[:, -1].contiguous()  # the decode step's layout: no new graph
    step.rows_dynamic(last)
    return step.head(last, body.norm.weight, step.model.lm_head.weight, step.eps)
