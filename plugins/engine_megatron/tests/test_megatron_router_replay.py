"""verl's router replay R2 on the CPU (one rank, megatron-core 0.16's MoE layers with
``moe_enable_routing_replay``, the all-gather dispatcher as in ``test_megatron_moe.py``): the
routing recorded by an old log-prob pass over two micro-batches is replayed in an update's
forward over one micro-batch of the same rows in another order, after the routers' weights were
perturbed so that routing afresh picks other experts: every real token goes to its recorded
experts, and the log-probs equal the HF model's (perturbed alike) with its routers forced to
those experts, row by row. Without a record the update routes afresh. On 2 gloo ranks at
TP=2 x EP=2 (sequence-parallel, the all-to-all dispatcher), each rank's routers replay their
slice of the record gathered over the TP group, for packed and padded rows."""

from __future__ import annotations

import pytest
import torch
from mcore_context import one_rank_model_parallel  # noqa: F401 (a fixture)
from test_megatron_moe import _model, cpu_router  # noqa: F401 (a fixture)
from test_megatron_sequence_parallel import _micro, _scored

from polyrl_engine_megatron.router_replay import RouterReplayR2, row_keys, token_order


def _megatron(hf_model: torch.nn.Module, packed: bool):
    from polyrl_engine_megatron.convert import (
        GPTShape,
        hf_to_megatron,
        pipeline_stages,
        stage_shards,
    )
    from polyrl_engine_megatron.model import build_gpt_model
    from polyrl_engine_megatron.scoring import Scorer, ScoringPaths
    from polyrl_engine_megatron.transformer_overrides import Recompute

    shape = GPTShape.from_hf_config(hf_model.config, 1)
    stage = pipeline_stages(shape.num_layers, 1)[0]
    model = build_gpt_model(
        shape,
        hf_model.config,
        stage,
        pipeline_parallel=1,
        recompute=Recompute(),
        overrides={
            "moe_token_dispatcher_type": "allgather",
            "variable_seq_lengths": False,
            "moe_enable_routing_replay": True,
        },
        device=torch.device("cpu"),
    )
    shards = stage_shards(hf_to_megatron(hf_model.state_dict(), shape), shape, stage)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(shards[name][0])
    paths = ScoringPaths.choose(
        remove_padding=packed, fused_log_prob=True, torch_compile=False, tp=1
    )
    return model, Scorer(shape, paths, torch.float32, None, torch.device("cpu"))


def _routed(model, run) -> list[torch.Tensor]:
    """Each MoE layer's experts (a ``[tokens, experts]`` bool map) while ``run()`` runs."""
    from megatron.core.transformer.moe.router import TopKRouter

    maps, hooks = [], []
    for module in model.modules():
        if isinstance(module, TopKRouter):
            hooks.append(module.register_forward_hook(lambda _m, _i, out: maps.append(out[1])))
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return maps


def _replayed(model, scorer, replay, micro) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each MoE layer's experts and the log-probs of ``micro``'s forward in a replaying pass."""
    result = {}

    def run() -> None:
        with replay.forward(model, micro):
            result["log_probs"] = _scored(model, scorer, micro)

    with replay.replaying_pass():
        maps = _routed(model, run)
    return maps, result["log_probs"]


def _perturb_routers(hf_model, model) -> None:
    """The same noise on both models' router weights (HF ``mlp.gate``, megatron
    ``mlp.router``): routing afresh then picks other experts for some tokens."""
    noise = torch.Generator().manual_seed(7)
    routers = [p for n, p in model.named_parameters() if n.endswith("mlp.router.weight")]
    gates = [layer.mlp.gate.weight for layer in hf_model.model.layers]
    with torch.no_grad():
        for router, gate in zip(routers, gates):
            delta = torch.randn(gate.shape, generator=noise) * 2.0
            router.add_(delta)
            gate.add_(delta)


def _hf_forced(hf_model, micro, forced: dict[bytes, list[torch.Tensor]]) -> torch.Tensor:
    """``[b, R]`` response log-probs of the HF model, each row alone, every MoE layer's router
    forced to ``forced[row][layer]`` (its softmax probabilities at those experts,
    renormalised as Qwen3-MoE's ``norm_topk_prob`` does)."""
    prompt = micro["input_ids"].shape[1] - micro["responses"].shape[1]
    out = torch.zeros(micro["responses"].shape)
    for row, (ids, mask, key) in enumerate(
        zip(micro["input_ids"], micro["attention_mask"], row_keys(micro))
    ):
        for layer, block in enumerate(hf_model.model.layers):
            gate = block.mlp.gate
            experts = forced[key][layer].long()

            def forward(hidden, gate=gate, experts=experts):
                logits = torch.nn.functional.linear(
                    hidden.reshape(-1, gate.hidden_dim), gate.weight
                )
                probs = torch.softmax(logits, dim=-1, dtype=torch.float)
                chosen = probs.gather(-1, experts)
                return logits, chosen / chosen.sum(-1, keepdim=True), experts

            gate.forward = forward
        real = ids[mask.bool()]
        logits = hf_model(real[None]).logits[0, :-1].float()
        log_probs = torch.log_softmax(logits, -1).gather(-1, real[1:, None])[:, 0]
        count = int(mask[prompt:].sum())
        out[row, :count] = log_probs[-count:]
    for block in hf_model.model.layers:
        del block.mlp.gate.forward
    return out


@pytest.mark.parametrize("packed", [True, False])
def test_r2_replays_the_recorded_experts(
    packed: bool,
    cpu_router,  # noqa: F811
    one_rank_model_parallel,  # noqa: F811
) -> None:
    hf_model = _model("qwen3_moe")
    model, scorer = _megatron(hf_model, packed)
    replay = RouterReplayR2([model], packed=packed, tp_group=None, tp=1, device=torch.device("cpu"))
    micro = _micro()
    with torch.no_grad(), replay.recording_pass():  # the old log-prob pass, 2 micro-batches
        for rows in ([0], [1, 2]):
            part = micro.select_rows(torch.tensor(rows))
            with replay.forward(model, part):
                _scored(model, scorer, part)
    layers = len(hf_model.model.layers)
    assert len(replay.record) == 3
    _perturb_routers(hf_model, model)

    update = micro.select_rows(torch.tensor([2, 0, 1]))
    index, _, _ = token_order(update, packed, 1, torch.device("cpu"))
    keys = row_keys(update)
    recorded = [
        torch.cat([replay.record[key][(id(model), layer)] for key in keys]).long()
        for layer in range(layers)
    ]

    def chosen(maps: list[torch.Tensor]) -> list[torch.Tensor]:
        return [m[index].nonzero()[:, 1].view(len(index), -1) for m in maps]

    def same(experts: torch.Tensor, expected: torch.Tensor) -> bool:
        return torch.equal(experts.sort(-1).values, expected.sort(-1).values)

    with torch.no_grad():
        fresh = chosen(_routed(model, lambda: _scored(model, scorer, update)))
    assert not all(same(f, r) for f, r in zip(fresh, recorded)), "the noise changed no routing"

    replayed, log_probs = _replayed(model, scorer, replay, update)  # the update's forward
    replayed = chosen(replayed)
    assert all(same(e, r) for e, r in zip(replayed, recorded))
    forced = {key: [replay.record[key][(id(model), n)] for n in range(layers)] for key in keys}
    expected = _hf_forced(hf_model, update, forced)
    torch.testing.assert_close(log_probs.detach(), expected, rtol=1e-5, atol=1e-5)


def test_without_a_record_the_update_routes_afresh(
    cpu_router,  # noqa: F811
    one_rank_model_parallel,  # noqa: F811
) -> None:
    """The old log-prob pass skipped (an on-policy update): nothing to replay."""
    model, scorer = _megatron(_model("qwen3_moe"), packed=True)
    replay = RouterReplayR2([model], packed=True, tp_group=None, tp=1, device=torch.device("cpu"))
    micro = _micro()
    with torch.no_grad():
        fresh = _routed(model, lambda: _scored(model, scorer, micro))
        with replay.replaying_pass(), replay.forward(model, micro):
            again = _routed(model, lambda: _scored(model, scorer, micro))
    assert all(torch.equal(a, b) for a, b in zip(fresh, again))


def test_router_replay_modes_are_checked_in_one_line() -> None:
    """verl's Qwen3-30B-A3B R2 split validates; R3 and routing files are refused."""
    from omegaconf import OmegaConf

    from polyrl.api.testing import schema_config
    from polyrl_engine_megatron.checks import check_config

    node = "actor_rollout_ref.actor"

    def problems(*overrides: str) -> list[str]:
        given = [
            "trainer.n_gpus_per_node=8",
            f"{node}.megatron.tensor_model_parallel_size=2",
            f"{node}.megatron.expert_model_parallel_size=8",
            *overrides,
        ]
        return check_config(OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(given)))

    assert problems(f"{node}.router_replay.mode=R2") == []
    (line,) = problems(f"{node}.router_replay.mode=R3")
    assert line.startswith(f"{node}.router_replay.mode=R3 asks for MoE router replay from the")
    assert "polyrl does not support it: use mode=R2" in line
    (line,) = problems(f"{node}.router_replay.mode=R2", f"{node}.router_replay.record_file=/x")
    assert line.startswith(f"{node}.router_replay.record_file=/x asks for dumping or loading")


def _tensor_expert_scenario(rank: int, world: int, path: str) -> list[dict]:
    """TP=2 x EP=2 (sequence-parallel: each rank's routers see half of the tokens): record over
    micro-batches [0] and [1, 2], perturb the routers, replay over [2, 0, 1]; per layout, the
    record, whether each layer routed this rank's tokens as recorded, and the log-probs."""
    from contextlib import nullcontext

    from megatron.core import parallel_state, tensor_parallel
    from test_megatron_moe import _cpu_moe
    from transformers import AutoConfig

    from polyrl_engine_megatron.convert import GPTShape, pipeline_stages
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.scoring import Scorer, ScoringPaths
    from polyrl_engine_megatron.transformer_overrides import Recompute

    _cpu_moe()
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *_: nullcontext()
    parallel_state.initialize_model_parallel(
        world, 1, expert_model_parallel_size=world, expert_tensor_parallel_size=1
    )
    group = parallel_state.get_tensor_model_parallel_group()
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, world)
    stage = pipeline_stages(shape.num_layers, 1)[0]
    out = []
    for packed in (True, False):
        model = build_gpt_model(
            shape,
            hf_config,
            stage,
            pipeline_parallel=1,
            recompute=Recompute(),
            overrides={"moe_enable_routing_replay": True},
            device=torch.device("cpu"),
            expert_parallel=world,
        )
        load_hf_weights(model, path, shape, stage, rank, False, rank, world)
        paths = ScoringPaths.choose(
            remove_padding=packed, fused_log_prob=True, torch_compile=False, tp=world
        )
        scorer = Scorer(shape, paths, torch.float32, group, torch.device("cpu"))
        replay = RouterReplayR2(
            [model], packed=packed, tp_group=group, tp=world, device=torch.device("cpu")
        )
        micro = _micro()
        with torch.no_grad(), replay.recording_pass():
            for rows in ([0], [1, 2]):
                part = micro.select_rows(torch.tensor(rows))
                with replay.forward(model, part):
                    _scored(model, scorer, part)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("mlp.router.weight"):
                    param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(7)))
        update = micro.select_rows(torch.tensor([2, 0, 1]))
        index, total, _ = token_order(update, packed, world, torch.device("cpu"))
        layers = shape.num_layers
        expected = []
        for layer in range(layers):  # this rank's slice of the recorded layout
            recorded = torch.cat([replay.record[k][(id(model), layer)] for k in row_keys(update)])
            full = torch.full((total, 2), -1, dtype=torch.long)
            full[index] = recorded.long()
            expected.append(full.chunk(world)[rank])
        with torch.no_grad():
            maps, log_probs = _replayed(model, scorer, replay, update)
        same = []
        for routed, wanted in zip(maps, expected):
            real = wanted[:, 0] >= 0  # padding tokens take any experts
            chosen = routed[real].nonzero()[:, 1].view(-1, 2)
            same.append(torch.equal(chosen, wanted[real].sort(-1).values))
        record = {k: [v[(id(model), n)] for n in range(layers)] for k, v in replay.record.items()}
        out.append({"record": record, "same": same, "log_probs": log_probs})
    parallel_state.destroy_model_parallel()
    return out


def test_r2_over_tensor_and_expert_parallel_ranks(tmp_path) -> None:
    """TP=2 x EP=2 on 2 gloo ranks, packed and padded rows: each rank's routers get their
    slice of the recorded routing, and the log-probs equal the HF model's forced to it."""
    from polyrl_engine_kit.launch import run_on_ranks

    pytest.importorskip("megatron.core")
    hf_model = _model("qwen3_moe")
    hf_model.save_pretrained(tmp_path)
    results = run_on_ranks(_tensor_expert_scenario, 2, str(tmp_path), timeout_s=240)
    with torch.no_grad():
        for layer in hf_model.model.layers:
            gate = layer.mlp.gate.weight
            gate.add_(torch.randn(gate.shape, generator=torch.Generator().manual_seed(7)))
    update = _micro().select_rows(torch.tensor([2, 0, 1]))
    for rank_results in results:
        for layout in rank_results:
            assert all(layout["same"])
            assert layout["record"].keys() == results[0][0]["record"].keys()
            expected = _hf_forced(hf_model, update, layout["record"])
            torch.testing.assert_close(layout["log_probs"], expected, rtol=1e-5, atol=1e-5)


def test_r2_under_another_strategy_is_refused() -> None:
    """The key is this plugin's; only its engine replays routing (core's verl_compat says so)."""
    from omegaconf import OmegaConf

    from polyrl.config.verl_compat import ROUTER_REPLAY, router_replay_problems

    def problems(strategy: str, mode: str) -> list[str]:
        actor = {"strategy": strategy, "router_replay": {"mode": mode}}
        cfg = OmegaConf.create({"actor_rollout_ref": {"actor": actor}})
        return router_replay_problems(cfg, {ROUTER_REPLAY})

    assert problems("megatron", "R2") == [] and problems("fsdp2", "disabled") == []
    (line,) = problems("fsdp2", "R2")
    assert line.startswith(f"{ROUTER_REPLAY}=R2 asks for MoE router replay with actor_rollout")
    assert line.endswith("router replay runs in strategy=megatron")
