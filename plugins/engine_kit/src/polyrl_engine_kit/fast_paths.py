"""Which of the engine's speed paths a model gets, decided once from the settings and the model.

Why one place: the paths depend on each other (the fused log-probs run on packed rows, packed
rows need the packed attention) and on what the model and device allow (Liger needs CUDA and
the package, the fused log-probs a plain linear output embedding), and the engine reports what
it uses in one log line, so that a benchmark's figures can be read against it. The FSDP and
DeepSpeed engines both take their paths, and their policy scores, from here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import torch

from polyrl.api import Batch, ConfigError, ModelHead
from polyrl_engine_kit.compiling import compile_decoder_layers
from polyrl_engine_kit.config import EngineSettings
from polyrl_engine_kit.liger import apply_liger
from polyrl_engine_kit.logprob import EntropyMode, TokenScores
from polyrl_engine_kit.modeling import decoder_layers
from polyrl_engine_kit.packed_attention import use_packed_attention
from polyrl_engine_kit.packed_scoring import (
    install_fused_forward,
    packed_log_probs,
    supports_fused,
)
from polyrl_engine_kit.scoring import response_log_probs
from polyrl_engine_kit.ulysses import SequenceParallel, use_ulysses_attention

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FastPaths:
    packed: bool  # micro-batches packed into one row (use_remove_padding)
    fused: bool  # policy scores by fused_logprob (use_fused_kernels, packed, a plain lm_head)
    liger: bool  # Liger kernels patched in (use_liger, CUDA, liger-kernel, layers not compiled)
    compiled: bool  # decoder layers through torch.compile (use_torch_compile, CUDA)
    fused_compiled: bool  # the fused log-probs' statistics compiled on CUDA (use_torch_compile)
    ulysses: int = 1  # ranks each packed row is split over (ulysses_sequence_parallel_size)


def layer_compile_backend(device: torch.device, settings: EngineSettings, lora: bool) -> str | None:
    """torch.compile's backend for the decoder layers, None to leave them eager: compiled on
    CUDA only (on a CPU the host is no faster than the kernels it launches, and CI has no time
    for Inductor's C++ builds), and not with LoRA: peft's adapted layers under Inductor did not
    finish compiling within 150 s on the H200 (full fine-tuning's take ~40 s), so a LoRA actor
    keeps its eager layers (with Liger's kernels) until that is measured to pay off."""
    if not settings.torch_compile or device.type != "cuda" or lora:
        return None
    return "inductor"


def prepare(
    model: torch.nn.Module,
    settings: EngineSettings,
    device: torch.device,
    lora: bool,
    partitioned: bool = False,
    sequence_parallel: SequenceParallel | None = None,
) -> FastPaths:
    """Patch ``model`` (before LoRA and sharding) for the paths the settings ask for and the
    device allows; ``lora``: the engine will wrap the model with adapters; ``partitioned``: the
    engine keeps each parameter partitioned outside the forward of the module that owns it
    (DeepSpeed ZeRO-3), so the layers stay eager (compiled layers were not tried against
    ZeRO-3's re-gathering in the backward); ``sequence_parallel``: packed rows split over that
    group (:mod:`.ulysses`; needs ``remove_padding``). The fused scores are decided by
    :func:`finish`."""
    backend = None if partitioned else layer_compile_backend(device, settings, lora)
    if backend is not None:
        compile_decoder_layers(model, decoder_layers(model), backend)
    # Compiled layers fuse what Liger's kernels would, without their per-call Python cost.
    liger = settings.use_liger and backend is None and apply_liger(model, device)
    if sequence_parallel is not None:
        if not settings.remove_padding:
            raise ConfigError(
                "Ulysses sequence parallelism splits packed rows: set "
                "actor_rollout_ref.model.use_remove_padding=true"
            )
        use_ulysses_attention(model, sequence_parallel)
    elif settings.remove_padding:
        use_packed_attention(model)
    return FastPaths(
        packed=settings.remove_padding,
        fused=False,
        liger=liger,
        compiled=backend is not None,
        fused_compiled=settings.torch_compile,
        ulysses=1 if sequence_parallel is None else sequence_parallel.size,
    )


def finish(
    model: torch.nn.Module,
    paths: FastPaths,
    settings: EngineSettings,
    head: ModelHead,
    partitioned: bool = False,
) -> FastPaths:
    """After LoRA and sharding: attach the fused scoring method to the root module when the
    settings ask for it and the (possibly LoRA-wrapped) model has a plain output embedding.
    Not for ``partitioned`` parameters (see :func:`prepare`): the fused scores read the output
    embedding's weight outside its module's forward, where ZeRO-3 has not gathered it."""
    fused = (
        not partitioned
        and paths.packed
        and settings.fused_log_prob
        and head is ModelHead.CAUSAL_LM
        and supports_fused(model)
    )
    if fused:
        install_fused_forward(model, compiled=paths.fused_compiled)
    paths = replace(paths, fused=fused)
    log.info("engine speed paths: %s", paths)
    return paths


def policy_scores(
    model: Any,
    batch: Batch,
    device: torch.device,
    paths: FastPaths,
    logits_to_keep: bool,
    *,
    temperature: float,
    entropy: EntropyMode,
    sequence_parallel: SequenceParallel | None = None,
    sum_pi_squared: bool = False,
) -> TokenScores:
    """Log-probs (and entropy, and ``sum_pi_squared``: verl's ``sum_v p_v^2`` per token)
    ``[b, R]`` of the response tokens, zero on padding, by the path ``paths`` chose: one packed
    row (fused or through the head; split over ``sequence_parallel`` when given), or padded
    rows (the head's logits only at response positions where the model takes
    ``logits_to_keep``)."""
    if paths.packed:
        return packed_log_probs(
            model,
            batch,
            device,
            temperature=temperature,
            entropy=entropy,
            fused=paths.fused,
            sequence_parallel=sequence_parallel,
            sum_pi_squared=sum_pi_squared,
        )
    return response_log_probs(
        model,
        batch,
        device,
        temperature=temperature,
        entropy=entropy,
        logits_to_keep=logits_to_keep,
        sum_pi_squared=sum_pi_squared,
    )
