"""Liger-Kernel's fused Triton kernels (RoPE, RMSNorm, SwiGLU) patched into the HF model.

Why: in a small model most of a layer's time outside the matmuls goes to element-wise kernels
(the norms, the rotary embedding, the gated MLP's activation), each a separate read and write
of the activations in eager PyTorch; Liger fuses each into one kernel. Its fused linear
cross-entropy is left off: the engine scores tokens with its own fused log-prob path
(:mod:`.fused_logprob`), which also gives per-token log-probs and entropy.

Optional: ``liger-kernel`` is the ``[cuda]`` extra of this package, and Triton needs CUDA, so
:func:`apply_liger` does nothing (and says so) on CPU or when the package is missing.
"""

from __future__ import annotations

import importlib.util
import logging

import torch

log = logging.getLogger(__name__)


def liger_available(device: torch.device) -> bool:
    """Liger can run here: a CUDA device and ``liger_kernel`` importable."""
    return device.type == "cuda" and importlib.util.find_spec("liger_kernel") is not None


def apply_liger(model: torch.nn.Module, device: torch.device) -> bool:
    """Patch ``model`` (before sharding) with Liger's kernels for its architecture; return
    whether it was patched."""
    if not liger_available(device):
        log.info("liger-kernel: not used (needs CUDA and the package: polyrl-engine-fsdp[cuda])")
        return False
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    model_type = getattr(model.config, "model_type", None)
    patch = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if patch is None:
        log.info("liger-kernel: no kernels for model type %r; not used", model_type)
        return False
    patch(model=model, cross_entropy=False, fused_linear_cross_entropy=False)
    return True
