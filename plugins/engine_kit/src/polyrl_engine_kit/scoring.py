"""Scoring polyrl's batch layout with a causal LM, whatever wraps or splits the model.

Rows are ``[left-padded prompt | right-padded response]``. A micro-batch keeps only the columns
that hold a real token in one of its rows, the model computes logits only at the response
positions (``logits_to_keep``), and those are scored in float32 with
:func:`~polyrl_engine_kit.logprob.token_scores`, so that every engine built on these
helpers gives the same numbers for the same weights. Nothing here depends on how the model is
sharded: ``model`` is anything whose call runs the HF forward (an FSDP module, a DeepSpeed
engine); the Megatron engine, whose forward differs, uses the inputs and the padding helpers.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

from polyrl.api import Batch
from polyrl_engine_kit.errors import BatchLayoutError
from polyrl_engine_kit.logprob import EntropyMode, TokenScores, token_scores
from polyrl_engine_kit.microbatch import TrimmedInputs, trim_columns

REQUIRED_KEYS = ("input_ids", "attention_mask", "responses")
MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def check_batch(batch: Batch, engine: str) -> None:
    """Raise :class:`BatchLayoutError` unless ``batch`` has the engine layout; ``engine`` names
    the engine in the message (e.g. ``"FSDP"``)."""
    missing = [key for key in REQUIRED_KEYS if key not in batch]
    if missing:
        raise BatchLayoutError(
            f"batch lacks {missing}; the {engine} engine needs input_ids [B, P+R], attention_mask "
            f"[B, P+R] and responses [B, R] (position_ids optional)"
        )
    ids, mask, responses = batch["input_ids"], batch["attention_mask"], batch["responses"]
    if ids.shape != mask.shape or ids.shape[1] <= responses.shape[1]:
        raise BatchLayoutError(
            f"input_ids {tuple(ids.shape)}, attention_mask {tuple(mask.shape)} and responses "
            f"{tuple(responses.shape)} do not fit the layout [prompt | response]"
        )


def response_mask(batch: Batch) -> torch.Tensor:
    """``response_mask`` when the batch has one, else the response part of the attention mask."""
    if "response_mask" in batch:
        return batch["response_mask"]
    return batch["attention_mask"][:, -batch["responses"].shape[1] :]


def accepts_logits_to_keep(hf_model: torch.nn.Module) -> bool:
    """Whether the HF model's forward can compute logits for the last positions only."""
    return "logits_to_keep" in inspect.signature(type(hf_model).forward).parameters


def model_inputs(
    batch: Batch, device: torch.device
) -> tuple[TrimmedInputs, dict[str, Any], torch.Tensor]:
    """The micro-batch without its all-padding columns, the HF model's keyword arguments, and
    the response part of the attention mask ``[b, R]`` (on ``device``)."""
    responses = batch["responses"].to(device)
    attention_mask = batch["attention_mask"].to(device)
    position_ids = batch.get("position_ids")
    trimmed = trim_columns(
        batch["input_ids"].to(device),
        attention_mask,
        None if position_ids is None else position_ids.to(device),
        responses,
    )
    kwargs: dict[str, Any] = {
        "input_ids": trimmed.input_ids,
        "attention_mask": trimmed.attention_mask,
        "position_ids": trimmed.position_ids,
        "use_cache": False,
    }
    return trimmed, kwargs, attention_mask[:, -responses.shape[1] :]


def pad_to_response(
    log_prob: torch.Tensor,
    ent: torch.Tensor | None,
    response_attention: torch.Tensor,
    kept: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores of the ``kept`` response columns back to the full width ``[b, R]``: zero on
    padding, and on the columns the trim cut away."""
    valid = response_attention[:, :kept].to(log_prob.dtype)
    pad = (0, response_attention.shape[1] - kept)
    log_prob = F.pad(log_prob * valid, pad)
    if ent is not None:
        ent = F.pad(ent * valid, pad)
    return log_prob, ent


def response_log_probs(
    model: Any,
    batch: Batch,
    device: torch.device,
    *,
    temperature: float,
    entropy: EntropyMode,
    logits_to_keep: bool,
    sum_pi_squared: bool = False,
) -> TokenScores:
    """Log-probs (and entropy, and ``sum_pi_squared``) ``[b, R]`` of the response tokens of an
    HF causal LM; zero on padding."""
    trimmed, kwargs, response_attention = model_inputs(batch, device)
    kept = trimmed.kept_response
    if logits_to_keep:
        kwargs["logits_to_keep"] = kept + 1
    logits = model(**kwargs).logits[:, -(kept + 1) : -1]
    scores = token_scores(logits, trimmed.labels, temperature, entropy, sum_pi_squared)
    del logits
    log_prob, ent = pad_to_response(scores.log_prob, scores.entropy, response_attention, kept)
    squares = scores.sum_pi_squared
    if squares is not None:
        squares = pad_to_response(squares, None, response_attention, kept)[0]
    return TokenScores(log_prob, ent, squares)


def dummy_logits(model: Any, device: torch.device) -> torch.Tensor:
    """Logits of a 2-token row: a pass that only joins the collectives of the other ranks (for
    a rank with fewer micro-batches than they have)."""
    ids = torch.zeros((1, 2), dtype=torch.long, device=device)
    return model(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        position_ids=torch.arange(2, device=device).unsqueeze(0),
        use_cache=False,
    ).logits
