"""verl's FSDP precision keys on the FSDP2 engine (one CPU rank over gloo): ``model_dtype``
(the dtype the master weights are created in) and ``mixed_precision.{param_dtype, reduce_dtype,
buffer_dtype}`` (FSDP2's MixedPrecisionPolicy; aliases of ``fsdp_config.param_dtype`` ...)."""

from __future__ import annotations

import math

import pytest
import torch
from test_fsdp_engine import _ctx, _full_batch, mean_logprob_loss

from polyrl.api import load_config
from polyrl.config.validate import validate_config

ACTOR_FSDP = "actor_rollout_ref.actor.fsdp_config"


def _engine(rank: int, world: int, path: str, fsdp: dict, **overrides: object):
    from polyrl_engine_fsdp.engine import FSDPEngine

    fsdp = {"reshard_after_forward": True, **fsdp}
    ctx = _ctx(rank, path, fsdp_config=fsdp, **overrides)
    ctx.world_size = world
    return FSDPEngine(ctx)


def _linear_dtypes(engine, batch) -> set[torch.dtype]:
    """The dtypes the decoder's linear layers compute in (their inputs and weights) during a
    log-prob pass."""
    seen: set[torch.dtype] = set()

    def hook(module, args, output):
        seen.update({args[0].dtype, module.weight.dtype, output.dtype})

    handles = [
        m.register_forward_hook(hook)
        for name, m in engine.model.named_modules()
        if isinstance(m, torch.nn.Linear) and ".layers." in name
    ]
    engine.compute_log_prob(batch)
    for handle in handles:
        handle.remove()
    return seen


def _scenario(rank: int, world: int, path: str) -> dict:
    batch = _full_batch()
    out: dict = {}
    # bf16 master weights (verl's model_dtype=bfloat16), no casts
    bf16 = _engine(rank, world, path, {"mixed_precision": False, "model_dtype": "bfloat16"})
    out["bf16_params"] = {p.dtype for p in bf16.model.parameters()}
    before = {k: v.clone() for k, v in bf16.named_weights()}
    out["bf16_metrics"] = bf16.train_step(batch, mean_logprob_loss)
    after = dict(bf16.named_weights())
    out["bf16_changed"] = any(not torch.equal(before[k], after[k]) for k in before)
    out["bf16_compute"] = _linear_dtypes(bf16, batch)
    del bf16
    # the default: fp32 master weights, bf16 compute (actor_rollout_ref.model.dtype)
    mixed = _engine(rank, world, path, {"mixed_precision": True}, mixed_precision=True)
    out["mixed_params"] = {p.dtype for p in mixed.model.parameters()}
    out["mixed_compute"] = _linear_dtypes(mixed, batch)
    del mixed
    # verl's mixed_precision.param_dtype=fp32: the forward runs in fp32 despite model.dtype bf16
    fp32 = _engine(
        rank, world, path, {"mixed_precision": True, "param_dtype": "fp32"}, mixed_precision=True
    )
    out["fp32_compute"] = _linear_dtypes(fp32, batch)
    out["fp32_metrics"] = fp32.train_step(batch, mean_logprob_loss)
    del fp32
    # buffer_dtype: floating-point buffers (rotary frequencies) cast
    buffers = _engine(rank, world, path, {"mixed_precision": False, "buffer_dtype": "bf16"})
    out["buffer_dtypes"] = {b.dtype for b in buffers.model.buffers() if b.is_floating_point()}
    del buffers
    # LoRA on bf16 master weights: peft keeps the adapters in fp32, FSDP2 gathers one dtype
    from polyrl_engine_fsdp.engine import FSDPEngine
    from polyrl_engine_kit.testing import composed_context

    fsdp = {"mixed_precision": False, "model_dtype": "bf16", "reduce_dtype": "bf16"}
    lora = FSDPEngine(
        composed_context(
            path,
            model={"dtype": "bfloat16", "lora_rank": 4, "lora_alpha": 8.0},
            actor={"ppo_micro_batch_size_per_gpu": 2, "fsdp_config": fsdp},
        )
    )
    out["lora_params"] = {p.dtype for p in lora.model.parameters()}
    out["lora_metrics"] = lora.train_step(batch, mean_logprob_loss)
    return out


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from fsdp_tiny_model import scenario_on_one_rank

    return scenario_on_one_rank(tmp_path_factory, _scenario)


def test_model_dtype_bfloat16_gives_bf16_master_weights_that_train(result: dict) -> None:
    assert result["bf16_params"] == {torch.bfloat16}
    assert result["bf16_compute"] == {torch.bfloat16}
    assert math.isfinite(result["bf16_metrics"]["actor/grad_norm"])
    assert result["bf16_changed"]


def test_param_dtype_float32_runs_the_forward_in_fp32(result: dict) -> None:
    assert result["mixed_params"] == {torch.float32}
    assert result["mixed_compute"] == {torch.bfloat16}  # the default casts to model.dtype
    assert result["fp32_compute"] == {torch.float32}
    assert math.isfinite(result["fp32_metrics"]["actor/grad_norm"])


def test_buffer_dtype_casts_the_buffers(result: dict) -> None:
    assert result["buffer_dtypes"] == {torch.bfloat16}


def test_lora_adapters_train_on_bf16_master_weights(result: dict) -> None:
    assert result["lora_params"] == {torch.bfloat16, torch.float32}
    assert math.isfinite(result["lora_metrics"]["actor/grad_norm"])


def test_verls_keys_validate_under_their_names() -> None:
    cfg = load_config(
        [
            "recipe=tiny",
            f"{ACTOR_FSDP}.model_dtype=bf16",
            f"+{ACTOR_FSDP}.mixed_precision.param_dtype=fp32",
            f"+{ACTOR_FSDP}.mixed_precision.reduce_dtype=fp32",
            f"+{ACTOR_FSDP}.mixed_precision.buffer_dtype=fp32",
        ]
    )
    fsdp = cfg.actor_rollout_ref.actor.fsdp_config
    assert (fsdp.model_dtype, fsdp.param_dtype, fsdp.reduce_dtype) == ("bf16", "fp32", "fp32")
    assert fsdp.buffer_dtype == "fp32"
    assert not [p for p in validate_config(cfg) if "dtype" in p]
    bad = load_config(["recipe=tiny", f"{ACTOR_FSDP}.mixed_precision.param_dtype=int4"])
    (line,) = [p for p in validate_config(bad) if "param_dtype" in p]
    assert line.startswith(f"{ACTOR_FSDP}.param_dtype='int4' is not a dtype the engines know")
