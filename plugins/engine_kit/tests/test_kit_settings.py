"""The LoRA keys are the engine kit's section, not core's: every engine built on the kit declares
them at verl's place, with the same types and defaults, so they are in the schema whichever of
those engines is installed and mean the same for each."""

from __future__ import annotations

from dataclasses import fields

import pytest
from omegaconf import OmegaConf

from polyrl.config.schema import PolyrlConfig
from polyrl.config.sections import schema_config, section_problems
from polyrl.registry import get_registry
from polyrl.specs import PluginKind, resolve_object
from polyrl_engine_kit.settings import MODEL, LoraModelSettings

KEYS = {
    "lora_rank": 0,
    "lora_alpha": 16.0,
    "target_modules": "all-linear",
    "lora_dropout": 0.0,
    "export_merged_lora": False,
    "exclude_modules": None,
    "lora_adapter_path": None,
}


def test_core_declares_no_lora_key() -> None:
    core = OmegaConf.structured(PolyrlConfig).actor_rollout_ref.model
    assert not set(KEYS) & set(core)


def test_the_kits_section_holds_verls_keys_at_their_defaults() -> None:
    assert {f.name: f.default for f in fields(LoraModelSettings)} == KEYS
    model = OmegaConf.select(schema_config(), MODEL)
    assert {key: model[key] for key in KEYS} == KEYS
    assert section_problems() == []  # declared by several engines, the same way


@pytest.mark.parametrize("engine", ["fsdp2", "deepspeed", "megatron"])
def test_every_engine_on_the_kit_declares_the_lora_keys(engine: str) -> None:
    registry = get_registry()
    if engine not in registry.names(PluginKind.TRAINING_ENGINE):
        pytest.skip(f"the {engine} engine's package is not installed")
    section = resolve_object(
        registry.get(PluginKind.TRAINING_ENGINE, engine).spec.config_sections[MODEL]
    )
    section = section if isinstance(section, type) else type(section)
    assert issubclass(section, LoraModelSettings)


def test_lora_keys_are_typed_and_range_checked() -> None:
    from polyrl.lora import lora_problems

    model = OmegaConf.select(schema_config(), MODEL)
    with pytest.raises(Exception, match="lora_rank"):
        model.lora_rank = "abc"
    model.lora_rank, model.lora_alpha, model.lora_dropout = 8, 0.0, 1.0
    assert lora_problems(model) == [
        f"{MODEL}.lora_alpha=0.0 must be a number > 0, e.g. 16",
        f"{MODEL}.lora_dropout=1.0 must be in [0, 1), e.g. 0.0",
    ]
