"""The vLLM rollout's keys of ``actor_rollout_ref.rollout`` (verl's names), mounted into the
schema by :mod:`polyrl.config.sections`. Light on purpose (no vLLM, no torch): every composed
config imports it. The other serving engine declares the same keys with the same defaults, so a
verl command line means the same whichever of the two it selects."""

from __future__ import annotations

from dataclasses import dataclass

ROLLOUT = "actor_rollout_ref.rollout"


@dataclass
class vLLMRolloutSettings:
    """The serving engine's batch limits: tokens and sequences per scheduler step, whether
    shared prompt prefixes reuse their KV cache (the n samples of one prompt do), and whether a
    long prompt's prefill is split over scheduler steps (chunked prefill)."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True


CONFIG_SECTIONS = {ROLLOUT: vLLMRolloutSettings}
