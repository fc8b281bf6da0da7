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


def _backward(model: torch.nn.Module, ids: torch.Tensor, shape: GPTShape) -> torch.Tensor:
    """The log-probs of ``ids`` through ``model`` (padded rows, the engine's attention), with
    the backward of their negative mean run."""
    from test_megatron_stages import _log_probs

    from polyrl_engine_megatron.attention import attention_mask, padded_layout

    positions = torch.arange(ids.shape[1]).expand_as(ids)
    logits = model(
        ids,
        positions,
        attention_mask(torch.ones_like(ids)),
        packed_seq_params=padded_layout(positions, shape.head_dim, shape.rope_theta),
    )
    log_probs = _log_probs(logits, ids)
    (-log_probs.mean()).backward()
    return log_probs


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
    log_probs = _backward(model, ids, shape)

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


class _HostStream:
    """Stands for a CUDA stream on the CPU: megatron-core's all-to-all dispatcher copies its
    token counts to the host on a side stream and waits for them; on the CPU they are there."""

    def wait_stream(self, _stream) -> None:
        pass

    def record_event(self):
        return self

    def synchronize(self) -> None:
        pass


def _cpu_moe() -> None:
    """In a rank process: megatron-core's MoE layers on the CPU (see the module docstring)."""
    from contextlib import nullcontext

    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    def to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
        """What its device-to-host copy gives on a GPU: split sizes as numpy arrays."""
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host
    stream = _HostStream()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.Stream = lambda *_, **__: stream
    torch.cuda.current_stream = lambda *_: stream
    torch.cuda.stream = lambda _stream: nullcontext()
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _rank_tokens(rank: int) -> torch.Tensor:
    return torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(10 + rank))


def _expert_parallel_scenario(rank: int, world: int, path: str, family: str) -> dict:
    """EP=2 over 2 data-parallel ranks, each its own tokens, the engine's dispatcher
    (all-to-all), build, loading, gradient averaging, grad norm and expert streaming."""
    from megatron.core import parallel_state
    from transformers import AutoConfig

    from polyrl_engine_megatron.convert import pipeline_stages
    from polyrl_engine_megatron.gradients import GradientGroups, average_gradients, global_norm
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.moe import gathered_experts, is_expert
    from polyrl_engine_megatron.transformer_overrides import Recompute

    _cpu_moe()
    parallel_state.initialize_model_parallel(
        1, 1, expert_model_parallel_size=world, expert_tensor_parallel_size=1
    )
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, 1)
    stage = pipeline_stages(shape.num_layers, 1)[0]
    model = build_gpt_model(
        shape,
        hf_config,
        stage,
        pipeline_parallel=1,
        recompute=Recompute(),
        device=torch.device("cpu"),
        expert_parallel=world,
    )
    load_hf_weights(model, path, shape, stage, 0, False, expert_rank=rank, expert_parallel=world)
    ids = _rank_tokens(rank)
    log_probs = _backward(model, ids, shape)
    names = [name for name, _ in model.named_parameters()]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    groups = GradientGroups(
        data_parallel=parallel_state.get_data_parallel_group(),
        data_parallel_size=parallel_state.get_data_parallel_world_size(),
        expert_data_parallel=parallel_state.get_expert_data_parallel_group(),
        expert_data_parallel_size=parallel_state.get_expert_data_parallel_world_size(),
        expert_parallel=parallel_state.get_expert_model_parallel_group(),
    )
    average_gradients(names, grads, groups)
    norm = global_norm(names, grads, groups, torch.device("cpu"))
    per_rank = shape.moe.num_experts // world
    group = parallel_state.get_expert_model_parallel_group()
    weights, mean_grads = {}, {}
    for (name, param), grad in zip(model.named_parameters(), grads):
        pairs = [(name, param.detach(), grad)]
        if is_expert(name):
            both = zip(
                gathered_experts(name, param.detach(), group, world, per_rank),
                gathered_experts(name, grad, group, world, per_rank),
            )
            pairs = [(n, p, g) for (n, p), (_, g) in both]
        for megatron_name, weight, gradient in pairs:
            weights.update(megatron_to_hf(megatron_name, [weight], shape))
            mean_grads.update(megatron_to_hf(megatron_name, [gradient], shape))
    parallel_state.destroy_model_parallel()
    n = shape.moe.num_experts
    return {
        "log_probs": log_probs.detach(),
        "norm": norm,
        "weights": dict(stack_experts(iter(weights.items()), n)),
        "grads": dict(stack_experts(iter(mean_grads.items()), n)),
    }


@pytest.mark.parametrize("family", ["qwen2_moe"])
def test_expert_parallel_ranks_equal_the_hf_model(tmp_path, family: str) -> None:
    """Each rank's log-probs are the HF model's on its tokens; after the engine's averaging,
    every gradient (dense, and each rank's experts) is the HF gradient of the mean of both
    ranks' losses, the grad norm is that gradient's, and streaming gives every rank every
    expert's weights."""
    from polyrl_engine_kit.launch import run_on_ranks

    pytest.importorskip("megatron.core")
    from test_megatron_stages import _log_probs

    hf_model = _model(family)
    hf_model.save_pretrained(tmp_path / "hf")
    results = run_on_ranks(
        _expert_parallel_scenario, 2, str(tmp_path / "hf"), family, timeout_s=150
    )
    losses = []
    for rank, result in enumerate(results):
        ids = _rank_tokens(rank)
        log_probs = _log_probs(hf_model(ids).logits, ids)
        torch.testing.assert_close(result["log_probs"], log_probs.detach(), rtol=1e-5, atol=1e-5)
        losses.append(-log_probs.mean())
    (sum(losses) / 2).backward()
    expected = {name: p.grad for name, p in hf_model.named_parameters()}
    norm = torch.sqrt(sum(g.float().pow(2).sum() for g in expected.values()))
    state = hf_model.state_dict()
    for result in results:
        assert result["grads"].keys() == expected.keys()
        for name, grad in expected.items():
            torch.testing.assert_close(result["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
        assert result["norm"] == pytest.approx(float(norm), rel=1e-5)
        assert all(torch.equal(result["weights"][name], state[name]) for name in state)


@pytest.mark.parametrize("tp", [1, 2])
def test_polyrl_export_joins_the_expert_parallel_shards(tmp_path, tp: int) -> None:
    """A checkpoint of 2 expert-parallel ranks at TP=``tp`` (expert-parallel ranks carved out
    of TP x DP), written as the engine writes it: the first lcm(TP, EP) ranks each write their
    (TP rank, EP rank) shard, its own experts renumbered from 0, whole; reads back as the HF
    model's weights."""
    import math
    import os

    from omegaconf import OmegaConf
    from test_megatron_export import _config

    from polyrl_engine_kit.checkpoint import loop_state
    from polyrl_engine_megatron.checkpoint import EXPERT, EXTRA_STATE, read_checkpoint, shard_name
    from polyrl_engine_megatron.convert import pipeline_stages, stage_shards
    from polyrl_engine_megatron.moe import local_experts

    model = _model("qwen3_moe")
    model.save_pretrained(tmp_path / "hf")
    hf = model.state_dict()
    shape = GPTShape.from_hf_config(model.config, tp)
    stage = pipeline_stages(shape.num_layers, 1)[0]
    whole = stage_shards(hf_to_megatron(hf, shape), shape, stage)
    folder = tmp_path / "actor"
    folder.mkdir()
    layout = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 1, EXPERT: 2}
    for rank in range(math.lcm(tp, 2)):
        tp_rank, ep_rank = rank % tp, rank % 2
        local = local_experts(whole, shape.moe.num_experts, ep_rank, 2)
        weights = {name: parts[tp_rank] for name, parts in local.items()}
        torch.save(
            {"model": weights, "optimizer": None}, folder / shard_name(tp_rank, 0, 1, ep_rank, 2)
        )
        extra = {**loop_state(0, None, torch.device("cpu")), "layout": layout}
        torch.save(extra, os.path.join(folder, EXTRA_STATE.format(rank=rank)))
    model_path = str(tmp_path / "hf")
    cfg = OmegaConf.create(_config(model_path))
    read = read_checkpoint(str(folder), cfg, model_path).state_dict()
    assert read.keys() == hf.keys()
    assert all(torch.equal(read[name], hf[name]) for name in hf)


def test_expert_sizes_are_checked_in_one_line() -> None:
    from omegaconf import OmegaConf

    from polyrl.api.testing import schema_config
    from polyrl_engine_megatron.checks import check_config

    node = "actor_rollout_ref.actor.megatron"

    def problems(*overrides: str) -> list[str]:
        given = ["trainer.n_gpus_per_node=8", *overrides]
        return check_config(OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(given)))

    # verl's Qwen3-30B-A3B script: EP=8 over 8 ranks, experts whole on each
    verl = (f"{node}.expert_model_parallel_size=8", f"{node}.expert_tensor_parallel_size=1")
    assert problems(*verl) == []
    assert problems(f"{node}.expert_model_parallel_size=3") == [
        f"{node}.expert_model_parallel_size=3 does not divide the 8 tensor x data-parallel ranks "
        f"of a pipeline stage of the actor (world size 8 = trainer.nnodes 1 x "
        f"trainer.n_gpus_per_node 8); megatron-core spreads the experts over them (expert "
        f"tensor parallelism 1)"
    ]
    (line,) = problems(f"{node}.expert_tensor_parallel_size=2")
    assert line.startswith(f"{node}.expert_tensor_parallel_size=2 asks for MoE expert tensor")


def test_expert_parallelism_with_tensor_parallelism_is_checked_against_tp_x_dp() -> None:
    """Expert-parallel ranks come out of a stage's TP x DP ranks (expert tensor parallelism 1):
    verl's Qwen3-30B-A3B router-replay split (TP=2, EP=8 on 8 workers) validates."""
    from omegaconf import OmegaConf

    from polyrl.api.testing import schema_config
    from polyrl_engine_megatron.checks import check_config

    node = "actor_rollout_ref.actor.megatron"

    def problems(tp: int, ep: int, pp: int = 1) -> list[str]:
        given = [
            "trainer.n_gpus_per_node=8",
            f"{node}.tensor_model_parallel_size={tp}",
            f"{node}.pipeline_model_parallel_size={pp}",
            f"{node}.expert_model_parallel_size={ep}",
        ]
        return check_config(OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(given)))

    assert problems(2, 8) == []
    assert problems(2, 4, pp=2) == []
    (line,) = problems(2, 8, pp=2)
    assert line.startswith(
        f"{node}.expert_model_parallel_size=8 does not divide the 4 tensor x data-parallel "
        f"ranks of a pipeline stage of the actor"
    )
