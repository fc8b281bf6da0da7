"""Scoring a micro-batch as one packed row (:mod:`.packing`) with a model using
:mod:`.packed_attention`: policy log-probs and entropy, or a value head's values, ``[b, R]``.

The policy's scores come either from the HF forward with ``logits_to_keep`` set to the packed
positions that predict response tokens, or, with ``fused``, from :func:`.linear_scores` on
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
from polyrl_engine_kit.fused_logprob import linear_scores
from polyrl_engine_kit.logprob import EntropyMode, TokenScores, token_scores
from polyrl_engine_kit.packing import PackedRows, pack_rows, to_device, unpack
from polyrl_engine_kit.ulysses import SequenceParallel, gather_scores, shard_packed

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
    with_sum_pi_squared: bool = False,
) -> TokenScores:
    """The root module's method: hidden states of the packed row, then fused scores."""
    lm = causal_lm(self)
    hidden = getattr(lm, lm.base_model_prefix)(**_model_kwargs(packed)).last_hidden_state[0]
    weight = lm.get_output_embeddings().weight
    return linear_scores(
        hidden[packed.score_index],
        weight,
        packed.labels,
        temperature,
        with_entropy,
        with_sum_pi_squared,
        compiled,
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


def _pack(
    batch: Batch, device: torch.device, sp: SequenceParallel | None
) -> tuple[PackedRows, PackedRows, list[int] | None]:
    """The micro-batch's packed row, the part of it this rank feeds the model (its slice under
    sequence parallelism, else the row itself) and, with ``sp``, each rank's score count."""
    packed = to_device(  # packed where the batch is (the host), then copied
        pack_rows(batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1]),
        device,
    )
    if sp is None:
        return packed, packed, None
    part, counts = shard_packed(packed, sp)
    return packed, part, counts


def _joined(
    scores: torch.Tensor, sp: SequenceParallel | None, counts: list[int] | None
) -> torch.Tensor:
    """The whole row's scores: this rank's own, or every rank's of its group joined."""
    return scores if sp is None or counts is None else gather_scores(scores, sp, counts)


def packed_log_probs(
    model: Any,
    batch: Batch,
    device: torch.device,
    *,
    temperature: float,
    entropy: EntropyMode,
    fused: bool,
    sequence_parallel: SequenceParallel | None = None,
    sum_pi_squared: bool = False,
) -> TokenScores:
    """Log-probs (and entropy, and ``sum_pi_squared``) ``[b, R]`` of the response tokens, zero
    on padding; ``fused`` needs :func:`install_fused_forward` on ``model``; with
    ``sequence_parallel`` (and the model on :mod:`.ulysses`' attention) each rank scores its
    slice and all get the whole."""
    sp = sequence_parallel
    packed, part, counts = _pack(batch, device, sp)
    if fused:
        scores = getattr(model, FUSED_METHOD)(
            part, temperature, entropy != EntropyMode.NONE, with_sum_pi_squared=sum_pi_squared
        )
        if scores.entropy is not None and entropy == EntropyMode.DETACHED:
            scores = scores._replace(entropy=scores.entropy.detach())
    else:
        logits = model(**_model_kwargs(part), logits_to_keep=part.score_index).logits
        scores = token_scores(logits, part.labels[None], temperature, entropy, sum_pi_squared)
        scores = TokenScores(*(None if t is None else t[0] for t in scores))

    def whole(scores_of_part: torch.Tensor | None) -> torch.Tensor | None:
        if scores_of_part is None:
            return None
        return unpack(_joined(scores_of_part, sp, counts), packed)

    return TokenScores(*(whole(t) for t in scores))  # type: ignore[arg-type]


def packed_values(
    model: Any,
    batch: Batch,
    device: torch.device,
    sequence_parallel: SequenceParallel | None = None,
) -> torch.Tensor:
    """A value head's outputs ``[b, R]`` in float32 at the positions that predict each real
    response token, zero on padding (``sequence_parallel``: as in :func:`packed_log_probs`)."""
    packed, part, counts = _pack(batch, device, sequence_parallel)
    values = model(**_model_kwargs(part)).logits[0, part.score_index, 0].float()
    return unpack(_joined(values, sequence_parallel, counts), packed)
