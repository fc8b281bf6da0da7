"""verl's ``megatron.override_transformer_config`` (CPU): which keys reach megatron-core's
TransformerConfig, which recompute the engine applies, what is refused or has no effect."""

from __future__ import annotations

import pytest
from test_megatron_convert import QWEN2

from polyrl.api import ConfigError
from polyrl_engine_megatron.convert import GPTShape
from polyrl_engine_megatron.transformer_overrides import (
    KEY,
    Recompute,
    recompute_plan,
    split,
    uneven_stage_problems,
)

VERL_RECOMPUTE = {
    "recompute_granularity": "full",
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
}


def test_verls_moe_script_overrides_split() -> None:
    passed, problems, notices = split(
        {
            **VERL_RECOMPUTE,
            "moe_router_dtype": "fp32",
            "moe_permute_fusion": True,
            "apply_rope_fusion": True,
            "gradient_accumulation_fusion": True,
            "init_method_std": 0.02,
        }
    )
    assert passed == {"init_method_std": 0.02, "moe_router_dtype": "fp32"}
    assert problems == []
    assert [line.split("=")[0] for line in notices] == [
        f"{KEY}.moe_permute_fusion",
        f"{KEY}.apply_rope_fusion",
        f"{KEY}.gradient_accumulation_fusion",
    ]
    assert all("has no effect in polyrl" in line for line in notices)


def test_keys_the_model_sets_and_explicit_layouts_are_refused_uneven_stages_pass() -> None:
    passed, problems, _ = split(
        {
            "hidden_size": 64,
            "num_layers_in_last_pipeline_stage": 1,
            "account_for_loss_in_pipeline_split": False,
            "pipeline_model_parallel_layout": "Et|tL",
        }
    )
    assert passed == {"num_layers_in_last_pipeline_stage": 1}  # False: megatron's default
    assert problems == [
        f"{KEY}.hidden_size=64: the Megatron engine sets hidden_size from the model's HF config "
        f"and its own settings; remove it",
        f"{KEY}.pipeline_model_parallel_layout=Et|tL asks for megatron-core's explicit pipeline "
        f"layout (verl); polyrl does not support it: use num_layers_in_first/last_pipeline_stage "
        f"or account_for_embedding/loss_in_pipeline_split",
    ]
    assert uneven_stage_problems({"num_layers_in_last_pipeline_stage": 1}, 2) == []
    assert uneven_stage_problems({"num_layers_in_last_pipeline_stage": 1}, 1) == [
        f"{KEY}.{{num_layers_in_last_pipeline_stage=1}} places layers on pipeline stages, but "
        f"pipeline_model_parallel_size is 1; remove them or set pipeline_model_parallel_size > 1"
    ]


@pytest.mark.parametrize(
    ("overrides", "checkpointing", "plan"),
    [
        ({}, False, Recompute()),
        ({}, True, Recompute(full=True)),
        (VERL_RECOMPUTE, False, Recompute(full=True)),
        ({**VERL_RECOMPUTE, "recompute_num_layers": 4}, False, Recompute(full=True)),
        (
            {**VERL_RECOMPUTE, "recompute_method": "block", "recompute_num_layers": 2},
            False,
            Recompute(full=True, layers=2),
        ),
        ({"recompute_granularity": "selective"}, False, Recompute(modules=("core_attn",))),
        (
            {"recompute_granularity": "selective", "recompute_modules": ["mlp", "moe"]},
            False,
            Recompute(modules=("mlp",)),
        ),
    ],
)
def test_recompute_plan(overrides: dict, checkpointing: bool, plan: Recompute) -> None:
    assert recompute_plan(overrides, gradient_checkpointing=checkpointing) == (plan, [])


def test_block_recompute_names_the_first_layers_of_a_stage() -> None:
    plan = Recompute(full=True, layers=2)
    assert [plan.layer_recomputed(i) for i in range(4)] == [True, True, False, False]
    assert not Recompute(modules=("core_attn",)).layer_recomputed(0)


def test_bad_recompute_settings_are_one_line_each() -> None:
    _, problems = recompute_plan(
        {"recompute_granularity": "full", "recompute_num_layers": 0}, gradient_checkpointing=False
    )
    assert problems == [
        f"{KEY}.recompute_granularity=full needs recompute_method=uniform or block, as in "
        f"megatron-core",
        f"{KEY}.recompute_num_layers=0: give a positive number of layers",
    ]
    _, problems, notices = split(
        {"recompute_granularity": "selective", "recompute_modules": ["moe"]}
    )
    assert problems == [] and "moe has no effect" in notices[0]


def test_passed_keys_reach_transformer_config() -> None:
    pytest.importorskip("megatron.core", reason="pip install 'polyrl-engine-megatron[cpu]'")
    from polyrl_engine_megatron.model import transformer_config

    hf = QWEN2
    shape = GPTShape.from_hf_config(hf, 1)
    config = transformer_config(shape, hf, pipeline_parallel=1, overrides={"init_method_std": 0.5})
    assert config.init_method_std == 0.5 and config.recompute_granularity is None
    with pytest.raises(ConfigError, match="no_such_key"):
        transformer_config(shape, hf, pipeline_parallel=1, overrides={"no_such_key": 1})


def test_the_engine_reads_them_from_the_roles_megatron_node() -> None:
    """What the engine takes from a composed context (CPU: nothing is built): the keys passed to
    TransformerConfig, the recompute, and verl's offload switches."""
    pytest.importorskip("megatron.core", reason="pip install 'polyrl-engine-megatron[cpu]'")
    from mcore_context import megatron_context

    from polyrl_engine_megatron.engine import _megatron_node, _transformer_overrides
    from polyrl_engine_megatron.offload import OffloadSettings

    overrides = {**VERL_RECOMPUTE, "recompute_method": "block", "init_method_std": 0.01}
    megatron = {"param_offload": True, "override_transformer_config": overrides}
    ctx = megatron_context("/unused", engine={}, megatron=megatron)
    assert OffloadSettings.from_node(_megatron_node(ctx)) == OffloadSettings(params=True)
    assert _transformer_overrides(ctx, False) == (
        {"init_method_std": 0.01},
        Recompute(full=True, layers=1),
    )
