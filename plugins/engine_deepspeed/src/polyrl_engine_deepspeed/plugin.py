"""Entry-point module: registers the DeepSpeed ZeRO engine under ``deepspeed``.

Light on purpose: only polyrl's hook marker and spec type are imported; the engine, its config
class and its check are named by import string and imported when a run selects them.
"""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import TrainingEngineSpec, hookimpl
from polyrl_engine_kit.settings import LORA_SECTIONS


@hookimpl
def polyrl_training_engines() -> Iterator[TrainingEngineSpec]:
    yield TrainingEngineSpec(
        name="deepspeed",
        description=(
            "DeepSpeed ZeRO 1/2/3 (plugins.deepspeed.zero_stage): bf16, CPU offload, token-budget "
            "micro-batches, sharded checkpoints, HF export"
        ),
        engine="polyrl_engine_deepspeed.engine:DeepSpeedEngine",
        supports_cpu=True,
        supports_cuda=True,
        supports_lora=False,
        supports_sequence_packing=False,
        supports_weight_sync=True,
        supports_checkpoint=True,
        runtime_modules=("torch", "deepspeed"),
        config_class="polyrl_engine_deepspeed.settings:DeepSpeedSettings",
        # read by the kit for every engine (this one refuses lora_rank > 0: supports_lora=False)
        config_sections=LORA_SECTIONS,
        config_check="polyrl_engine_deepspeed.checks:check_config",
        checkpoint_reader="polyrl_engine_deepspeed.checkpoint:read_checkpoint",
    )
