"""Interleaved (virtual) pipeline parallelism (verl's
``megatron.virtual_pipeline_model_parallel_size``) on the CPU over 2 gloo ranks: a 4-layer
Qwen2 split PP=2 x VPP=2 (rank 0 holds layers 0 and 2, rank 1 layers 1 and 3, as megatron-core
places them), each chunk built by megatron-core with its ``vp_stage`` and loaded from the HF
folder by the engine's converter: the chunks run in the model's order give the unsplit HF
model's log-probs, loss and every weight's gradient; streaming the chunks gives every rank the
whole HF state dict; a checkpoint saved as the engine saves it (one shard per rank, the chunks'
keys numbered) is exported back to the HF weights. The activations pass between the ranks by
hand: megatron-core's interleaved schedule needs CUDA (it runs on the GPU machine only). Also
the schedule's micro-batch grouping and the one-line refusals."""

from __future__ import annotations

import os
from importlib.util import find_spec

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from test_megatron_stages import _hf_model, _log_probs, _tokens, assert_matches_hf

from polyrl.api import ConfigError
from polyrl.api.testing import schema_config
from polyrl_engine_kit.checkpoint import loop_state
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_megatron.checkpoint import EXTRA_STATE, VIRTUAL, read_checkpoint, shard_name
from polyrl_engine_megatron.checks import check_config
from polyrl_engine_megatron.convert import (
    GPTShape,
    StageSplit,
    megatron_to_hf,
    virtual_stages,
)
from polyrl_engine_megatron.pipeline import at_least, interleaved_group_size

# Located, not imported: collecting this file must not load megatron into every test process.
pytestmark = pytest.mark.skipif(
    find_spec("megatron") is None, reason="pip install 'polyrl-engine-megatron[cpu]'"
)


def _scenario(rank: int, world: int, path: str, folder: str) -> dict:
    from megatron.core import parallel_state
    from transformers import AutoConfig

    from polyrl_engine_megatron.attention import attention_mask, padded_layout
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.pipeline import StageWeights
    from polyrl_engine_megatron.transformer_overrides import Recompute

    parallel_state.initialize_model_parallel(1, world, virtual_pipeline_model_parallel_size=2)
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, 1)
    stages = virtual_stages(shape.num_layers, world, 2)
    chunks = {}  # index in the model's chunks -> module
    for number, index in enumerate(range(rank, len(stages), world)):
        chunks[index] = build_gpt_model(
            shape,
            hf_config,
            stages[index],
            pipeline_parallel=world,
            recompute=Recompute(),
            device=torch.device("cpu"),
            virtual=2,
            chunk=number,
        )
        load_hf_weights(chunks[index], path, shape, stages[index], 0, False)

    ids = _tokens()
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    mask = attention_mask(torch.ones_like(ids))
    layout = padded_layout(positions, shape.head_dim, shape.rope_theta)
    hidden = (ids.shape[1], ids.shape[0], shape.hidden_size)
    result: dict = {"layers": [(stages[i].first_layer, stages[i].num_layers) for i in chunks]}
    inputs, outputs = {}, {}
    for index in range(len(stages)):  # forward through the chunks in the model's order
        if index not in chunks:
            continue
        if index > 0:
            inputs[index] = torch.empty(hidden)
            dist.recv(inputs[index], src=(index - 1) % world)
            inputs[index].requires_grad_(True)
            chunks[index].set_input_tensor(inputs[index])
        outputs[index] = chunks[index](ids, positions, mask, packed_seq_params=layout)
        if index < len(stages) - 1:
            dist.send(outputs[index].detach().contiguous(), dst=(index + 1) % world)
    for index in reversed(range(len(stages))):  # and backward in reverse
        if index not in chunks:
            continue
        if index == len(stages) - 1:
            log_probs = _log_probs(outputs[index], ids)
            loss = -log_probs.mean()
            loss.backward()
            result.update(log_probs=log_probs.detach(), loss=loss.item())
        else:
            grad = torch.empty(hidden)
            dist.recv(grad, src=(index + 1) % world)
            outputs[index].backward(grad)
        if index > 0:
            dist.send(inputs[index].grad.contiguous(), dst=(index - 1) % world)
    result["grads"] = {
        hf_name: tensor
        for index, module in chunks.items()
        for name, param in module.named_parameters()
        for hf_name, tensor in megatron_to_hf(stages[index].global_name(name), [param.grad], shape)
    }
    streamed = StageWeights(list(chunks.items()), stages, dist.group.WORLD, torch.device("cpu"))
    result["streamed"] = {
        hf_name: tensor.clone()
        for stage, name, tensor in streamed.stream(lambda stage, name: True)
        for hf_name, tensor in megatron_to_hf(stage.global_name(name), [tensor], shape)
    }
    # the engine's shard: its model is a ModuleList of the chunks (keys "<chunk>.<name>")
    modules = torch.nn.ModuleList([chunks[i] for i in sorted(chunks)])
    torch.save(
        {"model": modules.state_dict(), "optimizer": None}, f"{folder}/{shard_name(0, rank, world)}"
    )
    layout = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": world, VIRTUAL: 2}
    extra = {**loop_state(0, None, torch.device("cpu")), "layout": layout}
    torch.save(extra, os.path.join(folder, EXTRA_STATE.format(rank=rank)))
    parallel_state.destroy_model_parallel()
    return result


def test_interleaved_chunks_equal_the_unsplit_model(tmp_path) -> None:
    path, folder = str(tmp_path / "hf"), tmp_path / "ckpt"
    folder.mkdir()
    _hf_model(path, layers=4)
    first, last = run_on_ranks(_scenario, 2, path, str(folder), timeout_s=150)
    assert first["layers"] == [(0, 1), (2, 1)] and last["layers"] == [(1, 1), (3, 1)]

    state = assert_matches_hf(path, first, last).state_dict()
    for streamed in (first["streamed"], last["streamed"]):
        assert streamed.keys() == state.keys()
        assert all(torch.equal(streamed[name], state[name]) for name in state)

    cfg = OmegaConf.merge(
        schema_config(),
        OmegaConf.from_dotlist([f"actor_rollout_ref.model.path={path}", "trainer.device=cuda"]),
    )
    read = read_checkpoint(str(folder), cfg, path).state_dict()
    assert all(torch.equal(read[name], state[name]) for name in state)


def test_group_size_leaves_no_short_last_group() -> None:
    assert interleaved_group_size(4, 2) == 2  # megatron-core's default: the stage count
    assert interleaved_group_size(5, 2) == 3  # groups of 3 and 2 (2 and 2 would leave 1)
    assert interleaved_group_size(9, 2) == 3
    assert interleaved_group_size(7, 4) == 7  # 4 + 3, 5 + 2, 6 + 1 all leave fewer than 4
    with pytest.raises(ValueError, match="runs at least 2 micro-batches"):
        interleaved_group_size(1, 2)
    assert at_least([[0, 1, 2]], 2) == [[0], [1, 2]]
    assert at_least([[0], [1, 2, 3, 4]], 3) == [[0], [1, 2], [3, 4]]
    assert at_least([[0]], 2) == [[0]]  # one row: the engine refuses it in one line


def test_virtual_sizes_are_checked_in_one_line() -> None:
    vpp = "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size"
    pp = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"
    cfg = OmegaConf.merge(schema_config(), OmegaConf.from_dotlist([f"{vpp}=2"]))
    assert check_config(cfg) == [
        f"{vpp}=2 interleaves the chunks of several pipeline stages, but "
        f"pipeline_model_parallel_size is 1; set it > 1 or leave "
        f"virtual_pipeline_model_parallel_size unset"
    ]
    ok = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{pp}=2", "trainer.n_gpus_per_node=2"]))
    assert check_config(ok) == []
    with pytest.raises(ConfigError, match=r"= 4 model chunks do not divide the model.s 6"):
        virtual_stages(6, 2, 2)
    with pytest.raises(ConfigError, match="with uneven pipeline stages"):
        virtual_stages(8, 2, 2, StageSplit(first=1))
    assert [s.first_layer for s in virtual_stages(8, 2, 2)] == [0, 2, 4, 6]
