"""Entry-point module: registers the ``sglang`` rollout engine. Light on purpose (no SGLang, no
torch): ``polyrl plugins`` imports it in every process that lists plugins."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import RolloutEngineSpec, hookimpl
from polyrl_rollout_sglang.settings import CONFIG_SECTIONS


@hookimpl
def polyrl_rollout_engines() -> Iterator[RolloutEngineSpec]:
    yield RolloutEngineSpec(
        name="sglang",
        description="SGLang's offline engine in the worker: batched sampling with log-probs, "
        "bucketed in-memory weight sync, GPU memory release between generations (CUDA only)",
        engine="polyrl_rollout_sglang.engine:SGLangRolloutEngine",
        # SGLang has no CPU build on PyPI; core refuses trainer.device=cpu for this engine.
        supports_cpu=False,
        supports_cuda=True,
        supports_weight_sync=True,
        supports_sleep=True,
        supports_logprobs=True,
        # A LoRA run syncs merged weights (polyrl.lora).
        supports_lora_adapters=False,
        runtime_modules=("sglang",),
        # SGLang-specific rules of the run config (dtype, tensor parallelism, weight buckets)
        config_check="polyrl_rollout_sglang.checks:check_config",
        config_sections=CONFIG_SECTIONS,
    )
