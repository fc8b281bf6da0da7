"""``polyrl export`` of real checkpoints: FSDP2 (fp32 and bf16), DeepSpeed ZeRO-2 and ZeRO-3
(bf16), LoRA merged and as adapters. Each checkpoint is written by the engine itself on 2 gloo
ranks after a training step (so the weights are not the model folder's), committed as a run
commits it (driver state with the run config, ``COMPLETE`` marker); the export runs in this
process without Ray, and its folder, loaded with ``transformers.AutoModelForCausalLM``, gives the
engine's own logits on the check prompts, to float32 rounding for fp32 (the sharded forward
rounds differently; the export's own check, against the checkpoint's weights, is bitwise), within
bf16 rounding for bf16.
"""

from __future__ import annotations

import functools
import os
import tempfile

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.api.testing import build_tiny_model, schema_config
from polyrl.checkpoint import CheckpointManager, save_driver_state
from polyrl.cli import main
from polyrl.export import CHECK_PROMPTS, EXPORT_RECORD, export_checkpoint
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import ragged_batch

torch.set_num_threads(1)
WORLD = 2


@functools.cache
def _model() -> str:
    return build_tiny_model(tempfile.mkdtemp(prefix="polyrl_export_") + "/m")


def _run_config(strategy: str, dtype: str, lora_rank: int = 0, stage: int = 2) -> dict:
    overrides = {
        "actor_rollout_ref": {
            "model": {"path": _model(), "dtype": dtype, "lora_rank": lora_rank, "lora_alpha": 8.0},
            "actor": {
                "strategy": strategy,
                "ppo_micro_batch_size_per_gpu": 2,
                "optim": {"lr": 5e-2},
                "fsdp_config": {"mixed_precision": dtype != "float32"},
            },
        },
        "plugins": {"deepspeed": {"zero_stage": stage}} if strategy == "deepspeed" else {},
    }
    return OmegaConf.to_container(OmegaConf.merge(schema_config(), overrides), resolve=True)


def _prompt_ids() -> list[torch.Tensor]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_model())
    return [tokenizer(p, return_tensors="pt").input_ids for p in CHECK_PROMPTS]


def _loss(micro, log_prob, entropy):
    return -(log_prob * micro["response_mask"]).sum() / micro.meta["mini_batch_response_tokens"], {}


def _train_save_score(rank: int, world: int, config: dict, actor_dir: str, prompts: list):
    """One training step, the engine's checkpoint, then its logits on ``prompts``."""
    from polyrl.api import EngineContext

    cfg = OmegaConf.create(config)
    arr = cfg.actor_rollout_ref
    ctx = EngineContext(
        role="actor",
        model_path=str(arr.model.path),
        model=arr.model,
        engine=arr.actor,
        device="cpu",
        rank=rank,
        world_size=world,
        seed=3,
        total_training_steps=4,
        trainable=True,
    )
    if arr.actor.strategy == "deepspeed":
        from polyrl_engine_deepspeed.engine import DeepSpeedEngine

        engine = DeepSpeedEngine(ctx)
        forward = engine.engine
    else:
        from polyrl_engine_fsdp.engine import FSDPEngine

        engine = FSDPEngine(ctx)
        forward = engine.model
    generator = torch.Generator().manual_seed(rank)
    engine.train_step(ragged_batch([3, 5], [4, 2], 5, 4, generator), _loss)
    engine.save_checkpoint(actor_dir)
    forward.eval()
    with torch.no_grad():
        return [forward(input_ids=ids).logits.float() for ids in prompts]


def _checkpoint(root: str, config: dict) -> tuple[str, list[torch.Tensor]]:
    """A committed polyrl checkpoint of step 1 under ``root`` and the engine's logits."""
    manager = CheckpointManager(root)
    staging = manager.staging_dir(1)
    actor_dir = os.path.join(staging, "actor")
    logits = run_on_ranks(_train_save_score, WORLD, config, actor_dir, _prompt_ids())[0]
    save_driver_state(staging, {"step": 1, "config": config})
    return manager.commit(1, staging), logits


def _assert_engine_logits(out: str, engine_logits: list[torch.Tensor], exact: bool) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        for ids, want in zip(_prompt_ids(), engine_logits):
            got = model(input_ids=ids).logits.float()
            # fp32: the sharded forward's own rounding; bf16: that of weights and activations
            share = 1e-6 if exact else 2.0**-6
            assert (got - want).abs().max() <= share * want.abs().max()


@pytest.mark.parametrize(
    ("strategy", "dtype", "stage"),
    [
        ("fsdp2", "float32", 2),
        ("fsdp2", "bfloat16", 2),
        ("deepspeed", "bfloat16", 2),
        ("deepspeed", "bfloat16", 3),
    ],
)
def test_export_gives_the_engines_logits(tmp_path, strategy, dtype, stage) -> None:
    checkpoint, engine_logits = _checkpoint(
        str(tmp_path / "run"), _run_config(strategy, dtype, stage=stage)
    )
    result = export_checkpoint(checkpoint)
    assert result.out == str(tmp_path / "run" / "hf_model_step_1")
    assert result.check.passed and result.dtype == dtype
    if dtype == "float32":
        assert result.check.max_abs_diff == 0.0
    _assert_engine_logits(result.out, engine_logits, exact=dtype == "float32")


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory) -> tuple[str, list[torch.Tensor]]:
    root = tmp_path_factory.mktemp("lora") / "run"
    return _checkpoint(str(root), _run_config("fsdp2", "float32", lora_rank=4))


def test_lora_export_merged_gives_the_engines_logits(lora_checkpoint, tmp_path) -> None:
    checkpoint, engine_logits = lora_checkpoint
    result = export_checkpoint(checkpoint, str(tmp_path / "merged"))
    assert result.check.passed
    assert not os.path.exists(tmp_path / "merged" / "adapter_config.json")
    _assert_engine_logits(result.out, engine_logits, exact=False)
    # merged in fp32: only the rounding of W + s * B @ A against the unmerged layers
    torch.testing.assert_close(
        _loaded_logits(result.out)[0], engine_logits[0], rtol=1e-5, atol=1e-5
    )


def test_lora_export_adapters_loads_as_peft_adapter(lora_checkpoint, tmp_path, capsys) -> None:
    checkpoint, engine_logits = lora_checkpoint
    out = tmp_path / "adapters"
    assert main(["export", checkpoint, "--out", str(out), "--adapters"]) == 0
    assert "exported LoRA adapters" in capsys.readouterr().out
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    for got, want in zip(_loaded_logits(str(out)), engine_logits):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _loaded_logits(folder: str) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        return [model(input_ids=ids).logits.float() for ids in _prompt_ids()]


def test_export_replaces_its_own_earlier_export(lora_checkpoint, tmp_path) -> None:
    checkpoint, _ = lora_checkpoint
    out = tmp_path / "out"
    assert main(["export", checkpoint, "--out", str(out), "--adapters"]) == 0
    record = (out / EXPORT_RECORD).read_text()
    assert main(["export", checkpoint, "--out", str(out), "--merge-lora"]) == 0  # replaced
    assert (out / EXPORT_RECORD).read_text() == record
    assert not (out / "adapter_config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging left
