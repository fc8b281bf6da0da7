"""Which of the engine's speed paths a model gets, decided once from the settings and the model.

Why one place: the paths depend on each other (the fused log-probs run on packed rows, packed
rows need the packed attention) and on what the model and device allow (Liger needs CUDA and
the package, the fused log-probs a plain linear output embedding), and the engine reports what
it uses in one log line, so that a benchmark's figures can be read against it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from polyrl.interfaces.training_engine import ModelHead
from polyrl_engine_fsdp.config import EngineSettings
from polyrl_engine_fsdp.liger import apply_liger
from polyrl_engine_fsdp.packed_attention import use_packed_attention
from polyrl_engine_fsdp.packed_scoring import install_fused_forward, supports_fused

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FastPaths:
    packed: bool  # micro-batches packed into one row (use_remove_padding)
    fused: bool  # policy scores by fused_logprob (use_fused_kernels, packed, a plain lm_head)
    liger: bool  # Liger kernels patched in (use_liger, CUDA, liger-kernel installed)


def prepare(
    model: torch.nn.Module,
    settings: EngineSettings,
    device: torch.device,
    head: ModelHead | None,
) -> FastPaths:
    """Patch ``model`` (before sharding) for the paths the settings ask for and it allows.
    ``head``: the head the engine scores with, None where the fused scores cannot reach the
    model's own modules (a LoRA wrapper)."""
    liger = settings.use_liger and apply_liger(model, device)
    if settings.remove_padding:
        use_packed_attention(model)
    fused = (
        settings.remove_padding
        and settings.fused_log_prob
        and head is ModelHead.CAUSAL_LM
        and supports_fused(model)
    )
    paths = FastPaths(packed=settings.remove_padding, fused=fused, liger=liger)
    log.info("FSDP engine speed paths: %s", paths)
    return paths


def finish(model: torch.nn.Module, paths: FastPaths) -> None:
    """After sharding: attach the fused scoring method to the root module."""
    if paths.fused:
        install_fused_forward(model)
