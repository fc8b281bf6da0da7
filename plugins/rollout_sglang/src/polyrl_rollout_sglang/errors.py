"""Errors of the SGLang rollout plugin (light module: no SGLang import)."""

from __future__ import annotations

from polyrl.api import ConfigError, PolyrlError, RolloutEngineNotInstalledError

INSTALL_HINT = (
    "install SGLang through this package's extra on an NVIDIA GPU machine: "
    "pip install 'polyrl-rollout-sglang[cuda]' (SGLang has no CPU build; on CPU use "
    "actor_rollout_ref.rollout.name=vllm or hf)"
)


class SGLangNotInstalledError(RolloutEngineNotInstalledError):
    """``actor_rollout_ref.rollout.name=sglang`` was selected but ``import sglang`` fails (also an
    :class:`ImportError`)."""

    engine = "sglang"
    library = "SGLang"
    install_hint = INSTALL_HINT


class SGLangRolloutConfigError(ConfigError):
    """A value under ``actor_rollout_ref.rollout`` cannot be turned into SGLang engine arguments."""


class SGLangOutputError(PolyrlError):
    """SGLang answered a request with something the rollout layout cannot be built from (an
    aborted request, missing log-probs, token ids that disagree with their log-probs)."""
