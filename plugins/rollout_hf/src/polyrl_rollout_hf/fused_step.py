"""The decode step of Llama-family models (Qwen2, Llama, Mistral) written out, compiled on CUDA.

Why: replayed as a CUDA graph, the transformers forward of one decode step still runs every small
kernel it launches (an RMSNorm is six, a rotary embedding about ten), and at a few microseconds
each these, not the weights' bytes or the FLOPs, set the step time of a small model. Here the same
arithmetic is written as two functions per decoder layer, the one before attention (norm, q/k/v
projections, rotary embedding) and the one after it (output projection, residual, norm, gated
MLP, residual), which Inductor fuses into a few kernels each; the KV-cache write and the
attention (SDPA, or on CUDA the kernel of :mod:`polyrl_rollout_hf.decode_attention`) run between
them. Every layer calls the same two compiled graphs (weights are arguments),
so compiling costs two small graphs, not a model, and Inductor's on-disk caches
(:mod:`polyrl_rollout_hf.compile_cache`) make a later run's compile a cache load.

The operations and their order are transformers' (``Qwen2RMSNorm``, ``apply_rotary_pos_emb``,
``Qwen2MLP``, and the grouped-query attention of
:func:`~polyrl_rollout_hf.static_decode.grouped_decode_attention`), so the step computes what the
model's own forward computes; on CPU it runs uncompiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from polyrl_rollout_hf.compiled_shapes import rows_dynamic
from polyrl_rollout_hf.decode_attention import decode_attention

# model_type values whose decoder layers are exactly the block below (no extra norms, scaled
# embeddings, soft caps or sliding windows): transformers' Qwen2, Llama and Mistral classes.
LLAMA_FAMILY = ("qwen2", "llama", "mistral")


class LayerWeights(NamedTuple):
    """One decoder layer's tensors, as the model holds them (biases may be None)."""

    norm_in: torch.Tensor
    q: torch.Tensor
    q_bias: torch.Tensor | None
    k: torch.Tensor
    k_bias: torch.Tensor | None
    v: torch.Tensor
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    norm_mid: torch.Tensor
    gate: torch.Tensor
    gate_bias: torch.Tensor | None
    up: torch.Tensor
    up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    # q, k and v (gate and up) as row blocks of one tensor, when the parameters above are views
    # of it (:func:`merge_projections`): one GEMM instead of three (two); else None
    qkv: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None
    gate_up: torch.Tensor | None = None
    gate_up_bias: torch.Tensor | None = None


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the fused step cannot run ``model``, or None when it can."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in LLAMA_FAMILY:
        return f"model_type {kind!r} (the fused step knows {', '.join(LLAMA_FAMILY)})"
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {config.hidden_act!r} (needs silu)"
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if set(layer_types) != {"full_attention"} or getattr(config, "use_sliding_window", False):
        return "sliding-window attention layers"
    body = getattr(model, "model", None)
    if body is None or not hasattr(model, "lm_head") or not hasattr(body, "rotary_emb"):
        return "no model.model / lm_head / rotary_emb"
    for layer in body.layers:
        attention = layer.self_attn
        if any(hasattr(attention, name) for name in ("q_norm", "k_norm", "sinks")):
            return "attention with q/k norms or sinks"
        if not all(hasattr(layer.mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
            return "a decoder layer without a gated MLP"
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: normalised in float32, cast back, then scaled."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of ``x [rows, heads, D]`` with ``cos``/``sin [rows, 1, D]``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def before_attention(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    w: LayerWeights,
    eps: float,
    kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grouped queries ``[rows, KV, H/KV, D]``, and the new key and value ``[rows, KV, 1, D]``."""
    rows = x.shape[0]
    h = rms_norm(x, w.norm_in, eps)
    if w.qkv is None:  # three GEMMs (the default)
        q = rotate(F.linear(h, w.q, w.q_bias).view(rows, -1, head_dim), cos, sin)
        k = rotate(F.linear(h, w.k, w.k_bias).view(rows, kv_heads, head_dim), cos, sin)
        v = F.linear(h, w.v, w.v_bias).view(rows, kv_heads, 1, head_dim)
    else:  # one over the stacked weights, its columns split
        sizes = [w.q.shape[0], w.k.shape[0], w.v.shape[0]]
        q, k, v = F.linear(h, w.qkv, w.qkv_bias).split(sizes, dim=-1)
        q = rotate(q.reshape(rows, -1, head_dim), cos, sin)
        k = rotate(k.reshape(rows, kv_heads, head_dim), cos, sin)
        v = v.reshape(rows, kv_heads, 1, head_dim)
    return q.view(rows, kv_heads, -1, head_dim), k.unsqueeze(2), v


def after_attention(
    x: torch.Tensor, attention: torch.Tensor, w: LayerWeights, eps: float
) -> torch.Tensor:
    """The layer's output from its input ``x [rows, hidden]`` and attention ``[rows, H * D]``."""
    x = x + F.linear(attention, w.o, w.o_bias)
    h = rms_norm(x, w.norm_mid, eps)
    if w.gate_up is None:  # two GEMMs (the default)
        gated = F.silu(F.linear(h, w.gate, w.gate_bias)) * F.linear(h, w.up, w.up_bias)
    else:  # one over the stacked weights, its columns split
        gate, up = F.linear(h, w.gate_up, w.gate_up_bias).split(
            [w.gate.shape[0], w.up.shape[0]], dim=-1
        )
        gated = F.silu(gate) * up
    return x + F.linear(gated, w.down, w.down_bias)


def final_logits(
    x: torch.Tensor, norm: torch.Tensor, head: torch.Tensor, eps: float
) -> torch.Tensor:
    return F.linear(rms_norm(x, norm, eps), head)


def _bias(linear: torch.nn.Module) -> torch.Tensor | None:
    return linear.bias


def layer_weights(
    layer: torch.nn.Module, merged: tuple[Merged | None, Merged | None] = (None, None)
) -> LayerWeights:
    """``layer``'s tensors, read from its modules (a replaced parameter is seen at once), with
    ``merged`` (:func:`merge_projections`) wherever the modules' parameters are still views of
    it (a parameter replaced since, or moved, falls back to the separate GEMMs)."""
    attention, mlp = layer.self_attn, layer.mlp
    qkv = (
        merged[0]
        if _views_of(merged[0], attention.q_proj, attention.k_proj, attention.v_proj)
        else None
    )
    gate_up = merged[1] if _views_of(merged[1], mlp.gate_proj, mlp.up_proj) else None
    return LayerWeights(
        layer.input_layernorm.weight,
        attention.q_proj.weight,
        _bias(attention.q_proj),
        attention.k_proj.weight,
        _bias(attention.k_proj),
        attention.v_proj.weight,
        _bias(attention.v_proj),
        attention.o_proj.weight,
        _bias(attention.o_proj),
        layer.post_attention_layernorm.weight,
        mlp.gate_proj.weight,
        _bias(mlp.gate_proj),
        mlp.up_proj.weight,
        _bias(mlp.up_proj),
        mlp.down_proj.weight,
        _bias(mlp.down_proj),
        *(qkv or (None, None)),
        *(gate_up or (None, None)),
    )


class Merged(NamedTuple):
    """The weights (and biases) of several linears stacked by rows; theirs are views of it."""

    weight: torch.Tensor
    bias: torch.Tensor | None


def _views_of(merged: Merged | None, *linears: torch.nn.Module) -> bool:
    """Whether ``linears``' weights (and biases) are still the consecutive row blocks of
    ``merged``: a parameter replaced or moved since the merge no longer is."""
    if merged is None:
        return False
    for name, whole in (("weight", merged.weight), ("bias", merged.bias)):
        parts = [getattr(linear, name) for linear in linears]
        if whole is None:
            if any(part is not None for part in parts):
                return False
            continue
        address, size = whole.data_ptr(), whole.element_size()
        for part in parts:
            if part is None or part.data_ptr() != address or not part.is_contiguous():
                return False
            address += part.numel() * size
        if address != whole.data_ptr() + whole.numel() * size:
            return False
    return True


@torch.no_grad()
def _merge(*linears: torch.nn.Module) -> Merged | None:
    """Stack ``linears``' weights (and biases) by rows into one tensor and make each parameter
    a view of its block (same values, same dtype and device; an in-place update of a parameter,
    as the weight sync makes, writes the merged tensor). None, changing nothing, when they
    cannot be stacked (biases on some only, other dtypes or devices, other input sizes)."""
    weights = [linear.weight for linear in linears]
    biases = [linear.bias for linear in linears]
    first = weights[0]
    if any(
        w.dim() != 2
        or w.shape[1] != first.shape[1]
        or w.dtype != first.dtype
        or w.device != first.device
        for w in weights
    ):
        return None
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    has_bias = biases[0] is not None
    weight = torch.cat([w.detach() for w in weights])
    bias = torch.cat([b.detach() for b in biases]) if has_bias else None
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = weight[start : start + rows]
        if has_bias:
            linear.bias.data = bias[start : start + rows]
        start += rows
    return Merged(weight, bias)


def merge_projections(model: torch.nn.Module) -> list[tuple[Merged | None, Merged | None]]:
    """Per decoder layer, q/k/v and gate/up stacked (:func:`_merge`): what the fused step then
    computes with one GEMM each. The model's own forward reads the same values through the
    views, and ``state_dict`` names and shapes are unchanged."""
    merged = []
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        merged.append(
            (
                _merge(attention.q_proj, attention.k_proj, attention.v_proj),
                _merge(mlp.gate_proj, mlp.up_proj),
            )
        )
    return merged


class FusedDecodeStep:
    """The decode step of one Llama-family model over caller-owned static KV tensors.

    ``compile`` runs the per-layer functions through ``torch.compile`` (Inductor) on first use,
    traced with a symbolic row count (:mod:`~polyrl_rollout_hf.compiled_shapes`): the graphs are
    shared by every layer and every decoder shape. Weights are read from the model's modules at
    each call: an in-place update reaches the next step (and a CUDA graph captured over it)
    without any copy.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        compile: bool,
        merge: bool = False,
        attention_kernel: bool = False,
    ):
        self.model = model
        # attention by :func:`~polyrl_rollout_hf.decode_attention.decode_attention` (reading to
        # a device-side end, no span), else SDPA over the span with the mask
        self.attention_kernel = bool(attention_kernel)
        # q/k/v and gate/up as one GEMM each (:func:`merge_projections`), else three and two
        self.merged = (
            merge_projections(model) if merge else [(None, None)] * len(model.model.layers)
        )
        body = model.model
        self.body = body
        first = body.layers[0].self_attn
        self.eps = float(body.norm.variance_epsilon)
        self.scaling = float(first.scaling)
        self.layer_eps = [float(layer.input_layernorm.variance_epsilon) for layer in body.layers]
        self.before: Callable[..., Any] = before_attention
        self.after: Callable[..., Any] = after_attention
        self.head: Callable[..., Any] = final_logits
        self.compiled = bool(compile)
        if compile:
            # Round intermediates to the model's dtype where the eager operations do (Inductor
            # otherwise keeps them in float32), so fused bfloat16 results stay close to eager.
            options = {"emulate_precision_casts": True}
            self.before = torch.compile(before_attention, fullgraph=True, options=options)
            self.after = torch.compile(after_attention, fullgraph=True, options=options)
            self.head = torch.compile(final_logits, fullgraph=True, options=options)

    def __call__(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        column: torch.Tensor,
        caches: list[tuple[torch.Tensor, torch.Tensor]],
        *,
        span: int | None = None,
        read_end: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[rows, 1, V]`` after feeding ``input_ids [rows, 1]`` at ``position_ids
        [rows, 1]``; each layer's key and value are written at cache column ``column [1]`` of
        its ``(keys, values) [rows, KV, L, D]`` and attention reads the columns ``mask [rows, 1,
        1, L]`` allows among the first ``span`` (all by default: the caller knows that no row
        attends past it). With the attention kernel, ``read_end [1]`` (on the device) takes the
        span's place: the columns before it."""
        rows = input_ids.shape[0]
        kernel = self.attention_kernel
        if kernel:
            if read_end is None:
                raise ValueError("the fused step's attention kernel needs read_end")
            flat_mask = mask.view(rows, mask.shape[-1])
        mask = mask[..., :span]
        x = self.body.embed_tokens(input_ids)  # [rows, 1, hidden]
        cos, sin = self.body.rotary_emb(x, position_ids)  # [rows, 1, D]
        x = x.squeeze(1)
        self.rows_dynamic(x, cos, sin)
        layers = zip(self.body.layers, self.layer_eps, caches, self.merged, strict=True)
        for layer, eps, (keys, values), merged in layers:
            w = layer_weights(layer, merged)  # read each call: a replaced parameter is seen at once
            kv_heads, head_dim = keys.shape[1], keys.shape[3]
            q, k, v = self.before(x, cos, sin, w, eps, kv_heads, head_dim)
            keys.index_copy_(2, column, k)
            values.index_copy_(2, column, v)
            if kernel:
                attention = decode_attention(q, keys, values, flat_mask, read_end, self.scaling)
            else:
                attention = F.scaled_dot_product_attention(
                    q, keys[:, :, :span], values[:, :, :span], attn_mask=mask, scale=self.scaling
                ).reshape(rows, -1)
            self.rows_dynamic(attention)
            x = self.after(x, attention, w, eps)
        self.rows_dynamic(x)
        return self.head(x, self.body.norm.weight, self.model.lm_head.weight, self.eps).unsqueeze(1)

    def rows_dynamic(self, *tensors: torch.Tensor) -> None:
        """:func:`~polyrl_rollout_hf.compiled_shapes.rows_dynamic` where the functions are
        compiled."""
        if self.compiled:
            rows_dynamic(*tensors)
