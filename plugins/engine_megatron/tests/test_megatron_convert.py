"""HF <-> megatron-core weight conversion on the state-dict level (CPU): exact round trips for
Qwen2 (attention biases, tied embeddings) and Llama (GQA, untied) shapes at several tensor-parallel
sizes, and the converted shards have exactly the names and shapes of a real GPTModel's
parameters (built on the CPU, where megatron-core can build but not run a model)."""

from __future__ import annotations

import pytest
import torch
from mcore_context import one_rank_model_parallel  # noqa: F401 (a fixture)
from transformers import LlamaConfig, Qwen2Config

from polyrl.errors import ConfigError
from polyrl_engine_megatron.convert import (
    GPTShape,
    hf_to_megatron,
    is_tied_copy,
    megatron_to_hf,
    pipeline_stages,
    split_dim,
    stage_shards,
)

QWEN2 = Qwen2Config(
    vocab_size=450,  # not a multiple of 4: padded for TP=4
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    tie_word_embeddings=True,
)
LLAMA = LlamaConfig(
    vocab_size=448,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)


def _hf_state(config) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_()  # distinct values everywhere, so a misplaced row shows
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize(
    ("config", "tp"),
    [(QWEN2, 1), (QWEN2, 2), (QWEN2, 4), (LLAMA, 1), (LLAMA, 2)],
    ids=["qwen2-tp1", "qwen2-tp2", "qwen2-tp4", "llama-tp1", "llama-tp2"],
)
def test_round_trip_is_exact(config, tp: int) -> None:
    hf = _hf_state(config)
    shape = GPTShape.from_hf_config(config, tp)
    shards = hf_to_megatron(hf, shape)
    assert all(len(parts) == tp for parts in shards.values())
    back: dict[str, torch.Tensor] = {}
    for name, parts in shards.items():
        for hf_name, tensor in megatron_to_hf(name, parts, shape):
            assert hf_name not in back, hf_name
            back[hf_name] = tensor
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


LLAMA_4_LAYERS = LlamaConfig(**{**LLAMA.to_dict(), "num_hidden_layers": 4})


@pytest.mark.parametrize(
    ("config", "pp"),
    [(QWEN2, 2), (LLAMA, 2), (LLAMA_4_LAYERS, 2), (LLAMA_4_LAYERS, 4)],
    ids=["qwen2-tied-pp2", "llama-pp2", "llama4-pp2", "llama4-pp4"],
)
def test_pipeline_stages_partition_the_model_and_stream_back_exactly(config, pp: int) -> None:
    """Every weight on exactly one stage under its local name (the tied output layer's copy on
    the last stage aside), and the stages' weights, named globally again, convert back to the
    HF checkpoint exactly."""
    hf = _hf_state(config)
    shape = GPTShape.from_hf_config(config, 2)
    whole = hf_to_megatron(hf, shape)
    stages = pipeline_stages(shape.num_layers, pp)
    per_stage = shape.num_layers // pp
    assert [(s.first_layer, s.num_layers) for s in stages] == [
        (i * per_stage, per_stage) for i in range(pp)
    ]
    back: dict[str, torch.Tensor] = {}
    owners: dict[str, int] = {}
    for index, stage in enumerate(stages):
        local = stage_shards(whole, shape, stage)
        layers = {n.split(".")[2] for n in local if n.startswith("decoder.layers.")}
        assert layers == {str(i) for i in range(per_stage)}  # local indices from 0
        assert ("embedding.word_embeddings.weight" in local) == (index == 0)
        assert ("decoder.final_layernorm.weight" in local) == (index == pp - 1)
        for name, parts in local.items():
            if is_tied_copy(name, shape, stage):
                assert index == pp - 1 and name == "output_layer.weight"
                assert all(torch.equal(a, b) for a, b in zip(parts, whole[EMBEDDING]))
                continue
            global_name = stage.global_name(name)
            assert global_name not in owners, global_name
            owners[global_name] = index
            assert stage.local_name(global_name) == name
            assert all(torch.equal(a, b) for a, b in zip(parts, whole[global_name]))
            back.update(megatron_to_hf(global_name, parts, shape))
    assert owners.keys() == whole.keys()
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_pipeline_stages_must_divide_the_layers() -> None:
    with pytest.raises(
        ConfigError, match="pipeline_model_parallel_size=3 does not divide the model's 4 decoder"
    ):
        pipeline_stages(4, 3)


EMBEDDING = "embedding.word_embeddings.weight"


def test_shards_split_whole_groups_and_pad_the_vocabulary() -> None:
    hf = _hf_state(QWEN2)
    shape = GPTShape.from_hf_config(QWEN2, 4)
    assert shape.padded_vocab_size == 452 and shape.qkv_bias and shape.tied
    shards = hf_to_megatron(hf, shape)
    embedding = shards["embedding.word_embeddings.weight"]
    assert [tuple(s.shape) for s in embedding] == [(113, 64)] * 4
    assert (embedding[3][-2:] == 0).all()
    # rank 1 holds KV group 1: its 2 query heads, then key head 1, then value head 1
    qkv = shards["decoder.layers.0.self_attention.linear_qkv.weight"][1]
    d = shape.head_dim
    attn = "model.layers.0.self_attn."
    assert torch.equal(qkv[: 2 * d], hf[attn + "q_proj.weight"][2 * d : 4 * d])
    assert torch.equal(qkv[2 * d : 3 * d], hf[attn + "k_proj.weight"][d : 2 * d])
    assert torch.equal(qkv[3 * d :], hf[attn + "v_proj.weight"][d : 2 * d])
    # rank 2's fc1: its quarter of the gate projection, then its quarter of the up projection
    fc1 = shards["decoder.layers.1.mlp.linear_fc1.weight"][2]
    mlp = "model.layers.1.mlp."
    assert torch.equal(fc1[:24], hf[mlp + "gate_proj.weight"][48:72])
    assert torch.equal(fc1[24:], hf[mlp + "up_proj.weight"][48:72])


def test_shape_refuses_what_it_cannot_convert() -> None:
    with pytest.raises(ConfigError, match="qwen2_moe, qwen3_moe models; this model is 'gpt2'"):
        GPTShape.from_hf_config(type("C", (), {"model_type": "gpt2"})(), 1)
    with pytest.raises(ConfigError, match="num_key_value_heads=2 is not divisible by"):
        GPTShape.from_hf_config(LLAMA, 4)
    scaled = LlamaConfig(**LLAMA.to_dict())
    scaled.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    with pytest.raises(ConfigError, match="plain RoPE only; this model's RoPE is 'linear'"):
        GPTShape.from_hf_config(scaled, 1)


@pytest.mark.parametrize("config", [QWEN2, LLAMA], ids=["qwen2", "llama"])
def test_shards_fit_a_real_gpt_model(one_rank_model_parallel, config) -> None:  # noqa: F811
    """Names, shapes and TP split dims of megatron-core's own parameters: TP=1 shards have the
    model's shapes, and each weight splits along the ``partition_dim`` megatron-core gives it."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from polyrl_engine_megatron.model import transformer_config_kwargs

    shape = GPTShape.from_hf_config(config, 1)
    kwargs = transformer_config_kwargs(shape, config, pipeline_parallel=1)
    # initialised here so that megatron-core records each weight's partition_dim
    kwargs.update(perform_initialization=True, use_cpu_initialization=True)
    model = GPTModel(
        TransformerConfig(**kwargs),
        get_gpt_layer_local_spec(),
        vocab_size=shape.padded_vocab_size,
        max_sequence_length=64,
        share_embeddings_and_output_weights=shape.tied,
        position_embedding_type="rope",
    )
    params = dict(model.named_parameters())
    shards = hf_to_megatron(_hf_state(config), shape)
    assert shards.keys() == params.keys()
    for name, param in params.items():
        assert shards[name][0].shape == param.shape, name
        parallel = getattr(param, "tensor_model_parallel", False)
        assert split_dim(name) == (param.partition_dim if parallel else None), name
