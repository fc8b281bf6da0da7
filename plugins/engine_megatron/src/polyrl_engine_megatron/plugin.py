"""Entry-point module: registers the megatron-core engine under ``megatron``.

Light on purpose: only polyrl's hook marker and spec type are imported; the engine and its check
are named by import string and imported when a run selects them.
"""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import TrainingEngineSpec, hookimpl
from polyrl_engine_megatron.settings import CONFIG_SECTIONS


@hookimpl
def polyrl_training_engines() -> Iterator[TrainingEngineSpec]:
    yield TrainingEngineSpec(
        name="megatron",
        description=(
            "megatron-core GPTModel (local spec, no Transformer Engine): tensor (sequence-"
            "parallel), pipeline (uneven, interleaved), expert (Qwen2/3-MoE, router replay R2) "
            "and data parallelism from actor.megatron.*, vocab-parallel log-probs, value heads "
            "(critics), CPU offload, dist-checkpoint loading, HF export (CUDA)"
        ),
        engine="polyrl_engine_megatron.engine:MegatronEngine",
        supports_cpu=False,
        supports_cuda=True,
        supports_lora=False,
        supports_sequence_packing=False,
        supports_weight_sync=True,
        supports_value_head=True,
        supports_checkpoint=True,
        checkpoint_reader="polyrl_engine_megatron.checkpoint:read_checkpoint",
        runtime_modules=("torch", "megatron.core"),
        config_check="polyrl_engine_megatron.checks:check_config",
        config_sections=CONFIG_SECTIONS,
    )
