"""The DeepSpeed engine's pure parts: its config check, its settings and the DeepSpeed config it
builds from them (no DeepSpeed engine is started here)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from polyrl.api.testing import schema_config
from polyrl.config.validate import validate_config
from polyrl.errors import ConfigError
from polyrl.registry import discover
from polyrl.specs import PluginKind
from polyrl_engine_deepspeed.checks import check_config
from polyrl_engine_deepspeed.ds_config import deepspeed_config
from polyrl_engine_deepspeed.settings import DeepSpeedSettings, deepspeed_settings


def _cfg(*overrides: str):
    return OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(list(overrides)))


# ---- the config check ---------------------------------------------------------------------------
def test_config_check_is_registered_and_light():
    reg = discover().get(PluginKind.TRAINING_ENGINE, "deepspeed")
    assert reg.spec.config_check == "polyrl_engine_deepspeed.checks:check_config"
    assert reg.spec.runtime_modules == ("torch", "deepspeed")
    code = (
        "import sys, polyrl_engine_deepspeed.checks, polyrl_engine_deepspeed.settings\n"
        "print(int('torch' in sys.modules or 'deepspeed' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0"]


def test_config_check_lines():
    assert check_config(_cfg()) == []
    assert check_config(_cfg("plugins.deepspeed.zero_stage=3")) == []
    (line,) = check_config(_cfg("plugins.deepspeed.zero_stage=4"))
    assert line.startswith("plugins.deepspeed.zero_stage=4 is not a ZeRO stage; use 1")
    (line,) = check_config(_cfg("plugins.deepspeed.offload_param=true"))
    assert line.startswith(
        "plugins.deepspeed.offload_param=true needs plugins.deepspeed.zero_stage=3"
    )
    (line,) = check_config(_cfg("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"))
    assert line == (
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true configures the FSDP engine, "
        "not strategy=deepspeed; use plugins.deepspeed.offload_optimizer=true instead"
    )
    (line,) = check_config(_cfg("actor_rollout_ref.model.dtype=int8"))
    assert line.startswith("actor_rollout_ref.model.dtype='int8' is not a dtype the DeepSpeed")
    (line,) = check_config(_cfg("actor_rollout_ref.actor.log_prob_max_token_len_per_gpu=0"))
    assert line == (
        "actor_rollout_ref.actor.log_prob_max_token_len_per_gpu must be a positive integer, got 0"
    )


def test_validate_names_unknown_keys_and_still_checks_the_others():
    cfg = _cfg(
        "actor_rollout_ref.model.path=/nonexistent",
        "data.train_files=builtin:tiny_digits",
        "actor_rollout_ref.actor.strategy=deepspeed",
        "plugins.deepspeed.zero_stag=3",
        "plugins.deepspeed.offload_param=true",
    )
    problems = validate_config(cfg)
    assert any(
        p.startswith("unknown key plugins.deepspeed.zero_stag") and "zero_stage" in p
        for p in problems
    )
    assert any(p.startswith("plugins.deepspeed.offload_param=true needs") for p in problems)


def test_engine_settings_raise_the_same_lines():
    node = _cfg("plugins.deepspeed.zero_stage=0").actor_rollout_ref.model
    with pytest.raises(ConfigError, match="zero_stage=0 is not a ZeRO stage"):
        deepspeed_settings(node)
    node = _cfg("plugins.deepspeed.stage=3").actor_rollout_ref.model
    with pytest.raises(ConfigError, match=r"Did you mean plugins\.deepspeed\.zero_stage"):
        deepspeed_settings(node)
    node = _cfg("plugins.deepspeed.zero_stage=3").actor_rollout_ref.model
    assert deepspeed_settings(node) == DeepSpeedSettings(zero_stage=3)


# ---- the DeepSpeed config -----------------------------------------------------------------------
def _ds(settings: DeepSpeedSettings, **kwargs):
    options = {"dtype": "bfloat16", "clip_grad": 1.0, "on_cuda": True, "trainable": True}
    return deepspeed_config(settings, **{**options, **kwargs})


def test_polyrl_owns_accumulation_optimizer_and_schedule():
    config = _ds(DeepSpeedSettings())
    assert config["managed_gradient_accumulation"] is False
    assert config["gradient_accumulation_steps"] == 1
    assert "optimizer" not in config and "scheduler" not in config
    assert config["zero_force_ds_cpu_optimizer"] is False
    assert config["gradient_clipping"] == 1.0
    assert _ds(DeepSpeedSettings(), clip_grad=0.0)["gradient_clipping"] == 0.0


def test_precision_sections():
    assert _ds(DeepSpeedSettings())["bf16"] == {"enabled": True, "check_grad_overflow": True}
    assert _ds(DeepSpeedSettings(), dtype="float16")["fp16"]["enabled"] is True
    fp32 = _ds(DeepSpeedSettings(), dtype="float32")
    assert "bf16" not in fp32 and "fp16" not in fp32


def test_zero_sections_and_offload():
    zero = _ds(DeepSpeedSettings(zero_stage=3, offload_param=True, offload_optimizer=True))
    section = zero["zero_optimization"]
    assert section["stage"] == 3 and section["overlap_comm"] is True
    assert section["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert section["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    # on CPU there is nothing to overlap with and no memory to pin
    cpu = _ds(DeepSpeedSettings(zero_stage=2, offload_optimizer=True), on_cuda=False)
    assert cpu["zero_optimization"]["overlap_comm"] is False
    assert cpu["zero_optimization"]["offload_optimizer"]["pin_memory"] is False
    # stage 1 cannot overlap when polyrl owns the accumulation boundary
    assert _ds(DeepSpeedSettings(zero_stage=1))["zero_optimization"]["overlap_comm"] is False


def test_a_frozen_role_partitions_parameters_only_under_zero3():
    frozen = _ds(DeepSpeedSettings(zero_stage=2, offload_optimizer=True), trainable=False)
    assert frozen["zero_optimization"] == {
        "stage": 0,
        "overlap_comm": False,
        "contiguous_gradients": False,
    }
    frozen3 = _ds(DeepSpeedSettings(zero_stage=3, offload_param=True), trainable=False)
    assert frozen3["zero_optimization"]["stage"] == 3
    assert "offload_param" in frozen3["zero_optimization"]
