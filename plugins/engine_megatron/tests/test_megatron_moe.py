"""Qwen2-MoE and Qwen3-MoE in megatron-core's MoE layers, on the CPU: the weight conversion both
ways is exact (transformers' fused experts, TP=1 and TP=2), and a model built by the engine's
``build_gpt_model`` (local-spec MoE layers, the engine's router settings) and loaded by its
converter gives the HF model's log-probs, loss and every weight's gradient (experts, router,
shared expert and its gate, query/key norms). Expert parallelism 1.

megatron-core's MoE layers are written for CUDA: the router moves its weight to the current
CUDA device on first use (pointed at the CPU here), and the all-to-all token dispatcher the
engine uses synchronises on CUDA streams, so the forward test runs the all-gather dispatcher
(which moves the same tokens to the same experts; routing and experts are the same modules)
with fixed sequence lengths."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from mcore_context import one_rank_model_parallel  # noqa: F401 (a fixture)
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from polyrl.api import ConfigError
from polyrl_engine_megatron.convert import GPTShape, hf_to_megatron, megatron_to_hf
from polyrl_engine_megatron.moe import stack_experts

COMMON = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
MODELS = {
    # Qwen2-MoE: attention biases, a shared expert behind a sigmoid gate, top-k not renormalised
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM, {"shared_expert_intermediate_size": 24}),
    # Qwen3-MoE: query/key norms, renormalised top-k, no shared expert
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, {"head_dim": 8, "norm_topk_prob": True}),
}


def _model(family: str) -> torch.nn.Module:
    config_cls, model_cls, extra = MODELS[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**COMMON, **extra))
    with torch.no_grad():  # visible norms, biases and shared-expert gate
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.1)
            elif name.endswith(("bias", "shared_expert_gate.weight")):
                param.normal_(0.0, 0.3)
    return model.float()


def _to_hf(weights: dict, shape: GPTShape) -> dict[str, torch.Tensor]:
    converted = (
        pair for name, parts in weights.items() for pair in megatron_to_hf(name, parts, shape)
    )
    return dict(stack_experts(converted, shape.moe.num_experts))


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("tp", [1, 2])
def test_conversion_round_trips_exactly(family: str, tp: int) -> None:
    model = _model(family)
    shape = GPTShape.from_hf_config(model.config, tp)
    assert shape.moe is not None and shape.qk_norm == (family == "qwen3_moe")
    hf = model.state_dict()
    back = _to_hf(hf_to_megatron(hf, shape), shape)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_dense_layers_and_uneven_expert_sizes_are_refused() -> None:
    config = Qwen2MoeConfig(**COMMON, mlp_only_layers=[0])
    with pytest.raises(ConfigError, match=r"every layer is a MoE layer; .*mlp_only_layers=\[0\]"):
        GPTShape.from_hf_config(config, 1)
    with pytest.raises(ConfigError, match="moe_intermediate_size=16 is not divisible by"):
        GPTShape.from_hf_config(Qwen3MoeConfig(**COMMON, head_dim=8), 32)


@pytest.fixture
def cpu_router(monkeypatch):
    """megatron-core's router moves its weight to ``torch.cuda.current_device()``: the CPU.
    megatron-core 0.16 (the CPU machine's) leaves ``te_general_gemm`` undefined without
    Transformer Engine, where 0.19 sets it to None: the router's plain matmul either way."""
    from megatron.core.transformer.moe import moe_utils

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    if not hasattr(moe_utils, "te_general_gemm"):
        monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)


@pytest.mark.parametrize("family", list(MODELS))
def test_megatron_moe_layers_equal_the_hf_model(
    family: str,
    cpu_router,
    one_rank_model_parallel,  # noqa: F811
) -> None:
    from test_megatron_stages import _log_probs, _tokens

    from polyrl_engine_megatron.attention import attention_mask, padded_layout
    from polyrl_engine_megatron.convert import pipeline_stages, stage_shards
    from polyrl_engine_megatron.model import build_gpt_model
    from polyrl_engine_megatron.transformer_overrides import Recompute

    hf_model = _model(family)
    shape = GPTShape.from_hf_config(hf_model.config, 1)
    stage = pipeline_stages(shape.num_layers, 1)[0]
    model = build_gpt_model(
        shape,
        hf_model.config,
        stage,
        pipeline_parallel=1,
        recompute=Recompute(),
        overrides={"moe_token_dispatcher_type": "allgather", "variable_seq_lengths": False},
        device=torch.device("cpu"),
    )
    shards = stage_shards(hf_to_megatron(hf_model.state_dict(), shape), shape, stage)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(shards[name][0])
    ids = _tokens()
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    logits = model(
        ids,
        positions,
        attention_mask(torch.ones_like(ids)),
        packed_seq_params=padded_layout(positions, shape.head_dim, shape.rope_theta),
    )
    log_probs = _log_probs(logits, ids)
    (-log_probs.mean()).backward()

    expected = _log_probs(hf_model(ids).logits, ids)
    (-expected.mean()).backward()
    torch.testing.assert_close(log_probs, expected, rtol=1e-5, atol=1e-5)
    grads = _to_hf(
        {
            name: [param.grad if param.grad is not None else torch.zeros_like(param)]
            for name, param in model.named_parameters()
        },
        shape,
    )
    for name, param in hf_model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert dist.is_initialized()


@pytest.mark.parametrize("family", list(MODELS))
def test_polyrl_export_reads_a_moe_checkpoint(tmp_path, family: str) -> None:
    """Shards written as the engine writes them (PP=2: one MoE layer per stage) read back as
    the HF model's weights, each layer's experts fused again."""
    from omegaconf import OmegaConf
    from test_megatron_export import _config, _trained_weights, _write_megatron_checkpoint

    from polyrl_engine_megatron.checkpoint import read_checkpoint

    _model(family).save_pretrained(tmp_path / "hf")
    model_path = str(tmp_path / "hf")
    hf, hf_config = _trained_weights(model_path)
    _write_megatron_checkpoint(str(tmp_path / "actor"), hf, hf_config, tp=1, pp=2)
    read = read_checkpoint(
        str(tmp_path / "actor"), OmegaConf.create(_config(model_path)), model_path
    )
    state = read.state_dict()
    assert state.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(state[name], tensor), name
