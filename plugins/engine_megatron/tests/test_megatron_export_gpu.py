"""``polyrl export`` of a real Megatron engine checkpoint (CUDA, NCCL): the engine trains the tiny
model one step and saves it on TP x PP ranks (TP=1 on one GPU; TP=2 and PP=2 when there are 2),
the checkpoint is committed as a run commits it (driver state with the run config, ``COMPLETE``
marker), and exported in this process without Ray or megatron-core. The reader's float32 weights
are the engine's own (:meth:`~polyrl_engine_megatron.engine.MegatronEngine.named_weights`)
bitwise, and the exported bf16 folder, loaded with ``transformers``, gives the engine's logits on
the check prompts within bf16 rounding (the engine computes them through megatron-core's model and
output layer, the vocabulary gathered over the TP ranks). Run on the GPU machine with
``pytest plugins/engine_megatron/tests/test_megatron_export_gpu.py``.
"""

from __future__ import annotations

import os

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.api.testing import build_tiny_model, schema_config
from polyrl.checkpoint import CheckpointManager, save_driver_state
from polyrl.export import CHECK_PROMPTS, export_checkpoint
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import ragged_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")


def _run_config(model_path: str, tp: int, pp: int) -> dict:
    overrides = {
        "actor_rollout_ref": {
            "model": {"path": model_path, "dtype": "bfloat16"},
            "actor": {
                "strategy": "megatron",
                "ppo_micro_batch_size_per_gpu": 2,
                "optim": {"lr": 5e-2},
                "megatron": {
                    "tensor_model_parallel_size": tp,
                    "pipeline_model_parallel_size": pp,
                },
            },
        }
    }
    return OmegaConf.to_container(OmegaConf.merge(schema_config(), overrides), resolve=True)


def _prompt_ids(model_path: str) -> list[torch.Tensor]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return [tokenizer(p, return_tensors="pt").input_ids for p in CHECK_PROMPTS]


def _loss(micro, log_prob, entropy):
    return -(log_prob * micro["response_mask"]).sum() / micro.meta["mini_batch_response_tokens"], {}


def _engine_logits(engine, prompts: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The engine model's float logits ``[1, T, vocab]`` of each prompt (one unpadded row), as
    its forward computes them (megatron-core's schedule, autocast in the compute dtype, the
    output layer on the last stage's hidden states); on the rank that returns the output, None
    on the others."""
    import torch.distributed as dist

    from polyrl.api import Batch
    from polyrl_engine_megatron.attention import attention_mask, padded_layout
    from polyrl_engine_megatron.pipeline import run_schedule

    def step(micros, model):
        ids = next(micros)["input_ids"].to(engine.device)
        positions = torch.arange(ids.shape[1], device=engine.device).unsqueeze(0)
        layout = padded_layout(positions, engine.shape.head_dim, engine.shape.rope_theta)

        def logits_of(hidden_states, output_layer, output_weight, **_):
            logits, _ = output_layer(hidden_states, weight=output_weight)
            return logits.transpose(0, 1)  # [1, T, this rank's vocabulary slice]

        with torch.autocast("cuda", dtype=engine.compute_dtype):
            output = model(
                ids,
                positions,
                attention_mask(torch.ones_like(ids)),
                packed_seq_params=layout,
                output_processor=logits_of,
            )

        def keep(logits):
            parts = [logits]
            if engine.tp > 1:
                parts = [torch.empty_like(logits) for _ in range(engine.tp)]
                dist.all_gather(parts, logits.contiguous(), group=engine.tp_group)
            whole = torch.cat(parts, dim=-1)[..., : engine.shape.vocab_size]
            zero = torch.zeros((), device=engine.device)
            return zero, torch.ones((), dtype=torch.int, device=engine.device), whole.float().cpu()

        return (output if engine.is_last_stage else output.float()), keep

    engine.model.eval()
    with torch.no_grad():
        records = run_schedule(
            [engine.model], [Batch({"input_ids": ids}) for ids in prompts], step, forward_only=True
        )
    return records if engine.data_parallel_rank().returns_output else None


def _train_save_score(rank: int, world: int, config: dict, actor_dir: str, prompts: list) -> dict:
    """One training step, the engine's checkpoint, its weights and its logits on ``prompts``."""
    from polyrl.api import EngineContext
    from polyrl_engine_megatron.engine import MegatronEngine

    arr = OmegaConf.create(config).actor_rollout_ref
    ctx = EngineContext(
        role="actor",
        model_path=str(arr.model.path),
        model=arr.model,
        engine=arr.actor,
        device="cuda",
        rank=rank,
        world_size=world,
        seed=3,
        total_training_steps=4,
        trainable=True,
    )
    engine = MegatronEngine(ctx)
    generator = torch.Generator().manual_seed(0)  # TP and PP peers take the same rows
    engine.train_step(ragged_batch([3, 5], [4, 2], 5, 4, generator), _loss)
    engine.save_checkpoint(actor_dir)
    weights = {name: tensor.cpu().clone() for name, tensor in engine.named_weights()}
    return {"weights": weights, "logits": _engine_logits(engine, prompts)}


@pytest.mark.parametrize(
    ("tp", "pp"),
    [(1, 1), pytest.param(2, 1, marks=TWO_GPUS), pytest.param(1, 2, marks=TWO_GPUS)],
    ids=["tp1", "tp2", "pp2"],
)
def test_export_gives_the_engines_weights_and_logits(tmp_path, tp: int, pp: int) -> None:
    from transformers import AutoModelForCausalLM

    from polyrl_engine_megatron.checkpoint import read_checkpoint

    model_path = build_tiny_model(str(tmp_path / "tiny"))
    config = _run_config(model_path, tp, pp)
    prompts = _prompt_ids(model_path)
    manager = CheckpointManager(str(tmp_path / "run"))
    staging = manager.staging_dir(1)
    actor_dir = os.path.join(staging, "actor")
    results = run_on_ranks(
        _train_save_score, tp * pp, config, actor_dir, prompts, backend="nccl", timeout_s=600
    )
    save_driver_state(staging, {"step": 1, "config": config})
    checkpoint = manager.commit(1, staging)
    engine_weights = results[0]["weights"]
    (engine_logits,) = [r["logits"] for r in results if r["logits"] is not None]

    read = read_checkpoint(
        os.path.join(checkpoint, "actor"), OmegaConf.create(config), model_path
    ).state_dict()
    assert read.keys() == engine_weights.keys()
    initial = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    assert not torch.equal(read["model.norm.weight"], initial["model.norm.weight"])  # trained
    for name, tensor in engine_weights.items():
        assert torch.equal(read[name], tensor), name

    result = export_checkpoint(checkpoint)
    assert result.check.passed and result.dtype == "bfloat16"
    exported = AutoModelForCausalLM.from_pretrained(result.out)
    assert exported.dtype == torch.bfloat16
    # bf16 rounding of weights and activations relative to the logits' size, as polyrl
    # export's own check allows (seen on an H200, TP=1: max |diff| 0.031, tolerance 0.05; the
    # untrained model's logits differ from the engine's by 3)
    tolerance = 2.0**-6 * max(max(float(want.abs().max()) for want in engine_logits), 1.0)
    with torch.no_grad():
        for ids, want in zip(prompts, engine_logits):
            got = exported(input_ids=ids).logits.float()
            assert got.shape == want.shape
            assert float((got - want).abs().max()) <= tolerance
