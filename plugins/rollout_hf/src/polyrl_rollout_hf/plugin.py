"""Entry-point module of polyrl-rollout-hf: registers the ``hf`` rollout engine.

Kept light on purpose (no torch import): ``polyrl plugins`` imports every entry point.
"""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import RolloutEngineSpec, hookimpl


@hookimpl
def polyrl_rollout_engines() -> Iterator[RolloutEngineSpec]:
    yield RolloutEngineSpec(
        name="hf",
        description="transformers model with a KV-cached sampling loop: temperature/top-p/top-k, "
        "n samples, stop tokens, sampling log-probs; the dependable fallback (CPU and CUDA)",
        engine="polyrl_rollout_hf.engine:HFRolloutEngine",
        supports_cpu=True,
        supports_cuda=True,
        supports_weight_sync=True,
        supports_sleep=False,
        supports_logprobs=True,
        # A LoRA run syncs merged weights into the transformers model (polyrl.lora).
        supports_lora_adapters=False,
        runtime_modules=("torch", "transformers"),
    )
