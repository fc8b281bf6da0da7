"""Entry-point module: registers the ``vllm`` rollout engine. Light on purpose (no vLLM, no torch):
``polyrl plugins`` imports it in every process that lists plugins."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import RolloutEngineSpec, hookimpl
from polyrl_rollout_vllm.settings import CONFIG_SECTIONS


@hookimpl
def polyrl_rollout_engines() -> Iterator[RolloutEngineSpec]:
    yield RolloutEngineSpec(
        name="vllm",
        description="vLLM engine API in the worker process: batched sampling with log-probs, "
        "in-memory weight sync, KV-cache/weight sleep on CUDA (a no-op on CPU)",
        engine="polyrl_rollout_vllm.engine:VLLMRolloutEngine",
        supports_cpu=True,
        supports_cuda=True,
        supports_weight_sync=True,
        # True on CUDA; on CPU vLLM has no sleep mode and sleep()/wake_up() do nothing.
        supports_sleep=True,
        supports_logprobs=True,
        # A LoRA run syncs merged weights for now: vLLM's own LoRA path (LoRARequest) is not
        # wired yet (polyrl.lora).
        supports_lora_adapters=False,
        runtime_modules=("vllm",),
        # vLLM-specific rules of the run config (dtype, tensor parallelism), for `polyrl validate`
        config_check="polyrl_rollout_vllm.checks:check_config",
        config_sections=CONFIG_SECTIONS,
    )
