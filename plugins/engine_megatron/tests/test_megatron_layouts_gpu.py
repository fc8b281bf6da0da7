"""The engine's own calls for verl's Megatron layouts, on CUDA over NCCL (the CPU tests run the
same models with the stages and experts driven by hand; megatron-core's schedules need CUDA):
in float32, every layout gives the one-stage engine's log-probs, and one training step the same
grad norm and weights. Layouts: uneven stages (1 + 3 decoder layers), interleaved stages (PP=2 x
VPP=2), a Qwen2-MoE at EP=2 and at TP=2 x EP=2 (sequence-parallel; 2 GPUs), context
parallelism (CP=2, a packed row split over 2 GPUs: flash varlen with each chunk's own key
boundaries), and the
host-stepped optimizer (verl's ``optim.override_optimizer_config``, 1 GPU). Run on the GPU
machine with
``pytest -m gpu plugins/engine_megatron/tests/test_megatron_layouts_gpu.py``."""

from __future__ import annotations

import pytest
import torch
from mcore_context import megatron_context
from test_megatron_cuda import ENGINE, _batch, noisy_loss

from polyrl_engine_kit.launch import run_on_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
LAYOUTS = {
    "uneven": {
        "pipeline_parallel": 2,
        "megatron": {"override_transformer_config": {"num_layers_in_first_pipeline_stage": 1}},
    },
    "interleaved": {
        "pipeline_parallel": 2,
        "megatron": {"virtual_pipeline_model_parallel_size": 2},
    },
    "experts": {"megatron": {"expert_model_parallel_size": 2}},
    "tensor_experts": {"tensor_parallel": 2, "megatron": {"expert_model_parallel_size": 2}},
    "context": {"megatron": {"context_parallel_size": 2}},
}


def _model(path: str, moe: bool) -> str:
    """A 4-layer Qwen2 (or Qwen2-MoE with 4 experts) whose vocabulary covers ``_batch``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    sizes = {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    }
    torch.manual_seed(0)
    if moe:
        config = Qwen2MoeConfig(
            **sizes,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_experts=4,
            num_experts_per_tok=2,
        )
        Qwen2MoeForCausalLM(config).float().save_pretrained(path)
    else:
        Qwen2ForCausalLM(Qwen2Config(**sizes)).float().save_pretrained(path)
    return path


def _step(rank: int, world: int, path: str, layout: dict, engine_keys: dict = ENGINE) -> dict:
    """Log-probs, then one step, in float32 (every data-parallel rank the same rows)."""
    from polyrl_engine_megatron.engine import MegatronEngine

    ctx = megatron_context(
        path, engine=engine_keys, dtype="float32", rank=rank, world_size=world, **layout
    )
    engine = MegatronEngine(ctx)
    out = {"log_prob": engine.compute_log_prob(_batch(0))[0]}
    out["returns_output"] = engine.data_parallel_rank().returns_output
    out["metrics"] = engine.train_step(_batch(1), noisy_loss)
    out["weights"] = {name: t.cpu().clone() for name, t in engine.named_weights()}
    out["stepped_on"] = {p.device.type for p in engine.host_step.stepped}
    return out


def _compare(reference: dict, results: list[dict]) -> None:
    (returning,) = [rank for rank in results if rank["returns_output"]]
    torch.testing.assert_close(returning["log_prob"], reference["log_prob"], rtol=1e-5, atol=1e-5)
    norm = reference["metrics"]["actor/grad_norm"]
    for rank in results:
        assert rank["metrics"]["actor/grad_norm"] == pytest.approx(norm, rel=1e-4)
        assert rank["weights"].keys() == reference["weights"].keys()
        for name, tensor in reference["weights"].items():
            torch.testing.assert_close(rank["weights"][name], tensor, rtol=1e-5, atol=1e-6)


@TWO_GPUS
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_layout_equals_the_one_stage_engine(tmp_path, name: str) -> None:
    """``noisy_loss`` draws from the global RNG: both runs seed it alike (megatron_context)."""
    path = _model(str(tmp_path / "model"), moe=name in ("experts", "tensor_experts"))
    (reference,) = run_on_ranks(_step, 1, path, {}, backend="nccl", timeout_s=600)
    # data parallelism with the reference's rows on both ranks: the same mean gradient
    results = run_on_ranks(_step, 2, path, LAYOUTS[name], backend="nccl", timeout_s=600)
    _compare(reference, results)


def test_the_host_stepped_optimizer_equals_the_gpu_step(tmp_path) -> None:
    """verl's ``optimizer_cpu_offload`` with half of the parameters (by elements) stepped on
    the host: the same step as AdamW on the GPU, to float32 rounding."""
    path = _model(str(tmp_path / "model"), moe=False)
    (reference,) = run_on_ranks(_step, 1, path, {}, backend="nccl", timeout_s=600)
    overrides = {"optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5}
    engine = {**ENGINE, "optim": {**ENGINE["optim"], "override_optimizer_config": overrides}}
    (result,) = run_on_ranks(_step, 1, path, {}, engine, backend="nccl", timeout_s=600)
    assert reference["stepped_on"] == {"cuda"} and result["stepped_on"] == {"cpu", "cuda"}
    _compare(reference, [result])
