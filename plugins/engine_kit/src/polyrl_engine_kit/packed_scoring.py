"""Scoring a micro-batch as one packed row (:mod:`.packing`) with a model using
:mod:`.packed_attention`: policy log-probs and entropy, or a value head's values, ``[b, R]``.

The policy's scores come either from the HF forward with ``logits_to_keep`` set to the packed
positions that predict response tokens, or, with ``fused``, from :func:`.linear_log_prob` on
the last hidden states and the output embedding (no float32 ``[tokens, vocab]`` tensor). The
fused path reads the output embedding's weight outside the HF forward, so it runs as a method
of the root FSDP module registered with ``register_fsdp_forward_method``: FSDP then gathers the
root's parameters (embeddings, final norm, ``lm_head``) around it and reduces their gradients
after backward, exactly as for the model's own forward.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from polyrl.api import Batch
from polyrl_engine_kit.fused_logprob import linear_log_prob
from polyrl_engine_kit.logprob import EntropyMode, token_logprob_entropy
from polyrl_engine_kit.packing import PackedRows, pack_rows, unpack

FUSED_METHOD = "polyrl_fused_log_probs"


def supports_fused(model: torch.nn.Module) -> bool:
    """Whether the logits are a plain ``hidden @ W.T`` (a bias-free linear output embedding, not
    adapted by LoRA, and no logit soft-capping or scaling), which :func:`linear_log_prob`
    reproduces."""
    lm = causal_lm(model)
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    config = getattr(lm, "config", None)
    plain = all(
        getattr(config, key, None) in (None, 1.0)
        for key in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    )
    return isinstance(head, torch.nn.Linear) and head.bias is None and plain


def causal_lm(model: torch.nn.Module) -> Any:
    """The Hugging Face causal LM inside ``model``: itself, or the one a peft wrapper (LoRA)
    holds, whose layers then carry the adapters."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def _fused_log_probs(
    self: Any,
    packed: PackedRows,
    temperature: float,
    with_entropy: bool,
    compiled: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The root module's method: hidden states of the packed row, then fused scores."""
    lm = causal_lm(self)
    hidden = getattr(lm, lm.base_model_prefix)(**_model_kwargs(packed)).last_hidden_state[0]
    weight = lm.get_output_embeddings().weight
    return linear_log_prob(
        hidden[packed.score_index], weight, packed.labels, temperature, with_entropy, compiled
    )


def install_fused_forward(model: torch.nn.Module, compiled: bool) -> None:
    """Attach the fused scoring method to ``model`` (after ``fully_shard``, when it is an FSDP
    module, so that FSDP runs its forward hooks around it); ``compiled``: the softmax
    statistics through ``torch.compile`` on CUDA."""
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    method = functools.partial(_fused_log_probs, compiled=compiled)
    setattr(model, FUSED_METHOD, types.MethodType(method, model))
    if isinstance(model, FSDPModule):
        register_fsdp_forward_method(model, FUSED_METHOD)


def _model_kwargs(packed: PackedRows) -> dict[str, Any]:
    return {
        "input_ids": packed.input_ids,
        "position_ids": packed.position_ids,
        "cu_seq_lens_q": packed.cu_seqlens,
        "cu_seq_lens_k": packed.cu_seqlens,
        "max_length_q": packed.max_seqlen,
        "max_length_k": packed.max_seqlen,
        "use_cache": False,
    }


def _pack(batch: Batch, device: torch.device) -> PackedRows:
    return pack_rows(
        batch["input_ids"].to(device),
        batch["attention_mask"].to(device),
        batch["responses"].shape[1],
    )


def packed_log_probs(
    model: Any,
    batch: Batch,
    device: torch.device,
    *,
    temperature: float,
    entropy: EntropyMode,
    fused: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) ``[b, R]`` of the response tokens, zero on padding; ``fused``
    needs :func:`install_fused_forward` on ``model``."""
    packed = _pack(batch, device)
    if fused:
        log_prob, ent = getattr(model, FUSED_METHOD)(
            packed, temperature, entropy != EntropyMode.NONE
        )
        if ent is not None and entropy == EntropyMode.DETACHED:
            ent = ent.detach()
    else:
        logits = model(**_model_kwargs(packed), logits_to_keep=packed.score_index).logits
        log_prob, ent = token_logprob_entropy(logits, packed.labels[None], temperature, entropy)
        log_prob, ent = log_prob[0], None if ent is None else ent[0]
    return unpack(log_prob, packed), None if ent is None else unpack(ent, packed)


def packed_values(model: Any, batch: Batch, device: torch.device) -> torch.Tensor:
    """A value head's outputs ``[b, R]`` in float32 at the positions that predict each real
    response token, zero on padding."""
    packed = _pack(batch, device)
    values = model(**_model_kwargs(packed)).logits[0, packed.score_index, 0].float()
    return unpack(values, packed)
