"""Entry-point module: registers the FSDP2 engine under ``fsdp2`` and its alias ``fsdp``.

Light on purpose: only polyrl's hook marker and spec type are imported; the engine is named by
import string and imported when a run selects it.
"""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import TrainingEngineSpec, hookimpl
from polyrl_engine_fsdp.settings import CONFIG_SECTIONS, KEY_ALIASES

ENGINE = "polyrl_engine_fsdp.engine:FSDPEngine"
ENGINE_NAMES = ("fsdp2", "fsdp")
# FSDP-specific rules of the run config (dtype, HSDP, offload ...), run by `polyrl validate`.
CONFIG_CHECK = "polyrl_engine_fsdp.checks:check_config"
# `polyrl export`: a checkpoint read whole in one process
CHECKPOINT_READER = "polyrl_engine_fsdp.checkpoint:read_checkpoint"


def _spec(name: str, description: str) -> TrainingEngineSpec:
    return TrainingEngineSpec(
        name=name,
        description=description,
        engine=ENGINE,
        supports_cpu=True,
        supports_cuda=True,
        supports_lora=True,  # peft adapters: pip install 'polyrl-engine-fsdp[lora]'
        supports_sequence_packing=False,
        supports_weight_sync=True,
        supports_checkpoint=True,
        supports_value_head=True,
        runtime_modules=("torch",),
        config_check=CONFIG_CHECK,
        config_sections=CONFIG_SECTIONS,
        key_aliases=KEY_ALIASES,
        checkpoint_reader=CHECKPOINT_READER,
    )


@hookimpl
def polyrl_training_engines() -> Iterator[TrainingEngineSpec]:
    name, alias = ENGINE_NAMES
    yield _spec(
        name,
        "PyTorch FSDP2 (fully_shard): bf16 mixed precision, token-budget micro-batches, "
        "DCP checkpoints, HF export, value heads (critics)",
    )
    yield _spec(alias, "Same engine as fsdp2 (FSDP2, fully_shard); polyrl has no FSDP1 engine")
