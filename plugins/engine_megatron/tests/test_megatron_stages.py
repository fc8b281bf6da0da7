"""Uneven pipeline stages (verl's ``num_layers_in_first/last_pipeline_stage`` and
``account_for_embedding/loss_in_pipeline_split``) on the CPU: the engine's layer counts against
megatron-core's own placement for many layouts, and a Qwen2 split over 2 gloo ranks unevenly
(one decoder layer on the first stage, two on the last), built by megatron-core and loaded from
the HF folder by the engine's converter, whose log-probs, loss and every weight's gradient equal
the unsplit HF model's. The activations pass between the stages by hand (megatron-core's
pipeline schedule needs CUDA)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from polyrl.api import ConfigError
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_megatron.convert import (
    GPTShape,
    StageSplit,
    megatron_to_hf,
    pipeline_stages,
    stage_layer_counts,
)

LAYOUTS = [
    # (layers, stages, split, counts)
    (3, 2, StageSplit(first=1), [1, 2]),
    (3, 2, StageSplit(last=1), [2, 1]),
    (7, 3, StageSplit(first=1, last=2), [1, 4, 2]),
    (61, 16, StageSplit(first=4, last=1), [4] + [4] * 14 + [1]),  # verl's DeepSeek-V3 script
    (94, 8, StageSplit(last=10), [12] * 7 + [10]),
    (6, 4, StageSplit(embedding=True, loss=True), [1, 2, 2, 1]),
    (7, 4, StageSplit(embedding=True), [1, 2, 2, 2]),
    (4, 2, StageSplit(), [2, 2]),
]


@pytest.mark.parametrize(("layers", "stages", "split", "counts"), LAYOUTS)
def test_stage_counts_follow_megatron_core(layers, stages, split, counts) -> None:
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    assert stage_layer_counts(layers, stages, split) == counts
    config = TransformerConfig(
        num_layers=layers,
        hidden_size=8,
        num_attention_heads=2,
        pipeline_model_parallel_size=stages,
        pipeline_dtype=torch.float32,
        num_layers_in_first_pipeline_stage=split.first,
        num_layers_in_last_pipeline_stage=split.last,
        account_for_embedding_in_pipeline_split=split.embedding,
        account_for_loss_in_pipeline_split=split.loss,
    )
    for rank, stage in enumerate(pipeline_stages(layers, stages, split)):
        assert get_num_layers_to_build(config, pp_rank=rank) == stage.num_layers
        assert get_transformer_layer_offset(config, pp_rank=rank) == stage.first_layer


def test_layouts_that_do_not_fit_are_one_line() -> None:
    with pytest.raises(ConfigError, match=r"\[5\] leave -2 of the model's 3 decoder layers"):
        stage_layer_counts(3, 2, StageSplit(first=5))
    with pytest.raises(ConfigError, match="leave 4 of the model's 7 decoder layers for 3 other"):
        stage_layer_counts(7, 4, StageSplit(first=3))
    with pytest.raises(ConfigError, match="exclude each other"):
        stage_layer_counts(4, 2, StageSplit(first=1, loss=True))
    with pytest.raises(ConfigError, match="plus 1 for the embedding/loss"):
        stage_layer_counts(4, 2, StageSplit(embedding=True))


def _hf_model(path: str, layers: int = 3, tied: bool = False) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # visible biases and norms, so that their gradients are compared too
        for name, param in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                param.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.save_pretrained(path)


def _tokens() -> torch.Tensor:
    return torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))


def _log_probs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]


def _stage_scenario(rank: int, world: int, path: str, split: StageSplit) -> dict:
    """This rank's stage of the split model: its part of the forward and backward, and its
    weights' gradients under their HF names."""
    from megatron.core import parallel_state
    from transformers import AutoConfig

    from polyrl_engine_megatron.attention import attention_mask, padded_layout
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.transformer_overrides import Recompute

    parallel_state.initialize_model_parallel(1, world)
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, 1)
    stage = pipeline_stages(shape.num_layers, world, split)[rank]
    overrides = {k: v for k, v in zip(StageSplit.KEYS, vars(split).values()) if v}
    model = build_gpt_model(
        shape,
        hf_config,
        stage,
        pipeline_parallel=world,
        recompute=Recompute(),
        overrides=overrides,
        device=torch.device("cpu"),
    )
    load_hf_weights(model, path, shape, stage, 0, False)
    ids = _tokens()
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    mask = attention_mask(torch.ones_like(ids))
    layout = padded_layout(positions, shape.head_dim, shape.rope_theta)
    hidden_shape = (ids.shape[1], ids.shape[0], shape.hidden_size)
    result: dict = {"layers": (stage.first_layer, stage.num_layers)}
    if not stage.is_first:
        received = torch.empty(hidden_shape)
        dist.recv(received, src=rank - 1)
        received.requires_grad_(True)
        model.set_input_tensor(received)
    output = model(ids, positions, mask, packed_seq_params=layout)
    if stage.is_last:
        log_probs = _log_probs(output, ids)
        loss = -log_probs.mean()
        loss.backward()
        result.update(log_probs=log_probs.detach(), loss=float(loss))
    else:
        dist.send(output.detach().contiguous(), dst=rank + 1)
        grad = torch.empty(hidden_shape)
        dist.recv(grad, src=rank + 1)
        output.backward(grad)
    if not stage.is_first:
        dist.send(received.grad.contiguous(), dst=rank - 1)
    result["grads"] = {
        hf_name: tensor
        for name, param in model.named_parameters()
        for hf_name, tensor in megatron_to_hf(stage.global_name(name), [param.grad], shape)
    }
    parallel_state.destroy_model_parallel()
    return result


def test_uneven_stages_equal_the_unsplit_model(tmp_path) -> None:
    pytest.importorskip("megatron.core")
    _hf_model(str(tmp_path))
    split = StageSplit(first=1)
    first, last = run_on_ranks(_stage_scenario, 2, str(tmp_path), split, timeout_s=120)
    assert [first["layers"], last["layers"]] == [(0, 1), (1, 2)]

    assert_matches_hf(str(tmp_path), first, last)


def assert_matches_hf(path: str, first: dict, last: dict):
    """The split run's log-probs and loss (the last rank's) and its weights' gradients (both
    ranks') are the HF model's at ``path``; returns that model."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = _tokens()
    log_probs = _log_probs(hf(ids).logits, ids)
    loss = -log_probs.mean()
    loss.backward()
    torch.testing.assert_close(last["log_probs"], log_probs.detach(), rtol=1e-5, atol=1e-5)
    assert last["loss"] == pytest.approx(loss.item(), abs=1e-5)
    grads = {**first["grads"], **last["grads"]}
    expected = {name: p.grad for name, p in hf.named_parameters()}
    assert grads.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    return hf
