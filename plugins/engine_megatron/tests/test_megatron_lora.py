"""verl's Megatron LoRA group (``actor_rollout_ref.model.lora``) on the CPU: adapters on a real
megatron-core GPTModel (a 3-layer Qwen2 loaded by the engine's converter) at TP=1 and over 2
gloo ranks at TP=2, trained with AdamW as the engine trains them. At init the log-probs are the
base model's; a step changes the adapters only; the weight stream's merged weights, loaded into
the Hugging Face model, give the adapted model's log-probs; TP=2 follows TP=1 step by step (loss,
grad norm, merged weights); a short run lowers the loss; the engine's checkpoint restores the
adapters and their optimizer state, and ``polyrl export``'s reader merges them. Also the keys'
checks and ``polyrl validate`` of a verl LoRA command line."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch
import torch.distributed as dist
from mcore_context import one_rank_model_parallel  # noqa: F401 (a fixture)
from omegaconf import OmegaConf
from test_megatron_moe import cpu_router  # noqa: F401 (a fixture)
from test_megatron_stages import _hf_model, _log_probs

from polyrl.api.testing import schema_config
from polyrl.cli import main
from polyrl_engine_kit.checkpoint import loop_state
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_megatron.checks import check_config
from polyrl_engine_megatron.convert import GPTShape, megatron_to_hf, pipeline_stages, split_dim
from polyrl_engine_megatron.lora import LoraSpec, merge_adapters, merged_state

# Located, not imported: collecting this file must not load megatron into every test process.
pytestmark = pytest.mark.skipif(
    find_spec("megatron") is None, reason="pip install 'polyrl-engine-megatron[cpu]'"
)

LORA = "actor_rollout_ref.model.lora"
SPEC = LoraSpec(
    rank=4, alpha=8.0, targets=("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
)
STEPS = 16


def _tokens() -> torch.Tensor:
    """Two rows of 8 tokens: a multiple of TP=2 (sequence parallelism splits the sequence)."""
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))


def _cfg(*overrides: str):
    return OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(list(overrides)))


# ---- the keys ----------------------------------------------------------------------------------
def test_targets_follow_megatron_bridges_rule() -> None:
    spec = LoraSpec(rank=2, alpha=4.0, targets=("linear_proj", "*.layers.1.*.linear_qkv"))
    assert spec.scale == 2.0
    assert spec.adapts("decoder.layers.0.self_attention.linear_proj")
    assert spec.adapts("decoder.layers.1.self_attention.linear_qkv")
    assert not spec.adapts("decoder.layers.0.self_attention.linear_qkv")
    assert not spec.adapts("decoder.layers.0.mlp.linear_fc1")
    assert not spec.adapts("output_layer")
    experts = LoraSpec(rank=2, alpha=4.0, targets=("linear_fc1",))
    assert experts.adapts("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1")
    assert not experts.adapts("decoder.layers.0.mlp.router")


def test_verl_keys_checked_in_one_line_each() -> None:
    assert check_config(_cfg(f"{LORA}.rank=8", f"{LORA}.lora_A_init_method=kaiming")) == []
    assert check_config(_cfg(f"{LORA}.type=dora")) == []  # rank 0: LoRA off, nothing read
    refused = {
        "type=canonical_lora": "asks for canonical_lora adapters (verl); polyrl does not",
        "target_modules=[linear_q]": "names linear_q: adapters on other modules",
        "exclude_modules=[linear_fc2]": "asks for adapting every linear but the excluded",
        "a2a_experimental=true": "asks for LoRA's all-to-all",
        "adapter_path=/x": "asks for starting from saved Megatron adapters",
        "dtype=bf16": "asks for adapters stored in a lower precision",
        "lora_A_init_method=orthogonal": "must be one of xavier, kaiming, normal, zero",
        "dropout_position=middle": "must be pre or post",
        "alpha=0": "must be a number > 0",
        "freeze_language_model=false": "asks for training the whole language model beside",
    }
    for override, words in refused.items():
        (line,) = check_config(_cfg(f"{LORA}.rank=8", f"{LORA}.{override}"))
        assert line.startswith(f"{LORA}.") and words in line, line


def test_validate_accepts_verls_megatron_lora_command_line(capsys) -> None:
    verl_keys = [
        "recipe=tiny",
        "actor_rollout_ref.actor.strategy=megatron",
        "trainer.device=cuda",
        f"{LORA}.rank=8",
        f"{LORA}.alpha=16",
        f"{LORA}.lora_A_init_method=kaiming",
    ]
    assert main(["validate", *verl_keys]) == 0
    assert "config OK" in capsys.readouterr().out
    fsdp = [k.replace("strategy=megatron", "strategy=fsdp2") for k in verl_keys]
    assert main(["validate", *fsdp]) == 1
    assert (
        f"{LORA}.rank=8 is verl's key of the Megatron LoRA group for strategy=megatron; with "
        f"actor_rollout_ref.actor.strategy=fsdp2 use actor_rollout_ref.model.lora_rank"
    ) in capsys.readouterr().err


def test_merge_is_base_plus_scaled_product() -> None:
    generator = torch.Generator().manual_seed(0)
    w, a, b = (torch.randn(shape, generator=generator) for shape in ((6, 5), (2, 5), (6, 2)))
    qkv, norm = "decoder.layers.0.self_attention.linear_qkv", "decoder.final_layernorm.weight"
    weights = [
        ("s", f"{qkv}.weight", w),
        ("s", norm, w[0]),
        ("s", f"{qkv}.adapter.lora_B", b),
        ("s", f"{qkv}.adapter.lora_A", a),
    ]
    merged = list(merge_adapters(weights, 1.5, lambda tag, module: True))
    assert [name for _, name, _ in merged] == [norm, f"{qkv}.weight"]
    torch.testing.assert_close(merged[1][2], w + 1.5 * (b @ a), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="left unmerged"):
        list(merge_adapters(weights[:2], 1.5, lambda tag, module: True))


# ---- the model ---------------------------------------------------------------------------------
def _scenario(rank: int, world: int, path: str, folder: str, spec: LoraSpec) -> dict:
    """The 3-layer model split over ``world`` tensor-parallel ranks with adapters, trained for
    :data:`STEPS` AdamW steps on one batch; what the test compares, on every rank."""
    from contextlib import nullcontext

    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
    from transformers import AutoConfig

    from polyrl_engine_megatron import checkpoint as mckpt
    from polyrl_engine_megatron.attention import attention_mask, padded_layout
    from polyrl_engine_megatron.gradients import GradientGroups, global_norm
    from polyrl_engine_megatron.lora import add_adapters
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.pipeline import StageWeights
    from polyrl_engine_megatron.transformer_overrides import Recompute

    # sequence parallelism on the CPU: megatron-core's gathers allocate on the current CUDA
    # device, and its embedding forks the CUDA RNG for a dropout that is off here
    torch.cuda.current_device = lambda: "cpu"
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *_: nullcontext()
    parallel_state.initialize_model_parallel(world, 1)
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, world)
    (stage,) = pipeline_stages(shape.num_layers, 1)

    def built() -> torch.nn.Module:
        model = build_gpt_model(
            shape, hf_config, stage, pipeline_parallel=1, recompute=Recompute(), device=cpu
        )
        load_hf_weights(model, path, shape, stage, rank, False)
        return model

    cpu = torch.device("cpu")
    ids = _tokens()
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    mask = attention_mask(torch.ones_like(ids))
    layout = padded_layout(positions, shape.head_dim, shape.rope_theta)

    def log_probs(model: torch.nn.Module) -> torch.Tensor:
        output = model(ids, positions, mask, packed_seq_params=layout)
        return _log_probs(gather_from_tensor_model_parallel_region(output), ids)

    model = built()
    with torch.no_grad():
        base = log_probs(model)
    adapted = add_adapters(model, spec, seed=0, global_name=stage.global_name)
    with torch.no_grad():
        at_init = log_probs(model)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    first = {n: p.detach().clone() for n, p in trained.items()}
    optimizer = torch.optim.AdamW(trained.values(), lr=1e-2, weight_decay=0.0)
    groups = GradientGroups(tensor_parallel=dist.group.WORLD if world > 1 else None)
    losses, norms = [], []
    for step in range(STEPS):
        loss = -log_probs(model).mean()
        loss.backward()
        grads = [p.grad for p in trained.values()]
        for param in trained.values():  # as the engine sums a sequence-parallel weight's
            if world > 1 and getattr(param, "sequence_parallel", False):
                dist.all_reduce(param.grad)
        norms.append(global_norm(list(trained), grads, groups, cpu))
        losses.append(float(loss))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 0:
            changed = sorted(n for n, p in trained.items() if not torch.equal(p, first[n]))
    unchanged = all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)

    model.eval()
    with torch.no_grad():
        final = log_probs(model)
    # the engine's weight stream: each rank's shards merged, gathered, converted to HF names
    streamed = StageWeights([(0, model)], [stage], dist.group.WORLD, cpu).stream(lambda s, n: True)
    merged: dict[str, torch.Tensor] = {}
    for stage_, name, shard in merge_adapters(
        streamed, spec.scale, lambda s, module: spec.adapts(s.global_name(module))
    ):
        shards = [shard]
        if world > 1 and split_dim(name) is not None:
            shards = [torch.empty_like(shard) for _ in range(world)]
            dist.all_gather(shards, shard.contiguous())
        merged.update(megatron_to_hf(stage_.global_name(name), shards, shape))

    # the engine's checkpoint: a fresh model with other adapters resumes the trained ones
    saved = {"tensor_model_parallel_size": world, "pipeline_model_parallel_size": 1}
    saved[mckpt.LORA_SCALE] = spec.scale
    shard = mckpt.shard_name(rank, 0, 1)
    extra = {**loop_state(STEPS, None, cpu), "layout": saved}
    mckpt.save(folder, model, optimizer, extra, shard=shard, writes_shard=True)
    fresh = built()
    add_adapters(fresh, spec, seed=1, global_name=stage.global_name)
    fresh.eval()
    resumed_optimizer = torch.optim.AdamW(
        [p for p in fresh.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0
    )
    mckpt.load(folder, fresh, resumed_optimizer, shard=shard, layout=saved)
    with torch.no_grad():
        resumed = log_probs(fresh)
    moments = [s["exp_avg"] for s in resumed_optimizer.state.values()]
    parallel_state.destroy_model_parallel()
    return {
        "adapted": adapted,
        "base": base,
        "at_init": at_init,
        "changed_first_step": changed,
        "base_unchanged": unchanged,
        "losses": losses,
        "norms": norms,
        "final": final,
        "merged": merged,
        "resumed": resumed,
        "moments": len(moments) == len(trained) and all(m.abs().sum() > 0 for m in moments),
    }


def _hf_log_probs(path: str, state: dict[str, torch.Tensor]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hf.load_state_dict(state)
    ids = _tokens()
    with torch.no_grad():
        return _log_probs(hf(ids).logits, ids)


def test_lora_at_tp1_and_tp2(tmp_path) -> None:
    from polyrl_engine_megatron.checkpoint import read_checkpoint

    path = str(tmp_path / "hf")
    _hf_model(path)
    folders = {tp: str(tmp_path / f"ckpt_tp{tp}") for tp in (1, 2)}
    (one,) = run_on_ranks(_scenario, 1, path, folders[1], SPEC, timeout_s=240)
    two = run_on_ranks(_scenario, 2, path, folders[2], SPEC, timeout_s=240)

    assert one["adapted"] == 12  # four linears in each of three layers
    assert torch.equal(one["at_init"], one["base"])
    # the first step moves every B (A's gradient is B's, zero at init) and nothing else
    linears = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1")
    assert one["changed_first_step"] == sorted(
        f"decoder.layers.{layer}.{linear}.adapter.lora_B"
        for layer in range(3)
        for linear in (*linears, "mlp.linear_fc2")
    )
    assert one["base_unchanged"] and all(r["base_unchanged"] for r in two)
    assert one["losses"][-1] < 0.9 * one["losses"][0]
    # the rollout's weights: the merged model gives the adapted model's log-probs
    torch.testing.assert_close(
        _hf_log_probs(path, one["merged"]), one["final"], rtol=1e-5, atol=1e-5
    )
    for rank in two:  # TP=2: every step as TP=1, the same merged weights on every rank
        torch.testing.assert_close(rank["base"], one["base"], rtol=1e-5, atol=1e-5)
        assert torch.equal(rank["at_init"], rank["base"])
        assert rank["losses"] == pytest.approx(one["losses"], rel=1e-5)
        assert rank["norms"] == pytest.approx(one["norms"], rel=1e-4)
        assert rank["merged"].keys() == one["merged"].keys()
        for name, tensor in one["merged"].items():
            torch.testing.assert_close(rank["merged"][name], tensor, rtol=1e-4, atol=1e-5)
    for result in (one, *two):  # the checkpoint restored the adapters and their moments
        assert torch.equal(result["resumed"], result["final"]) and result["moments"]
    cfg = _cfg(f"actor_rollout_ref.model.path={path}", "trainer.device=cuda")
    for tp, result in ((1, one), (2, two[0])):  # polyrl export of the checkpoint: merged
        read = read_checkpoint(folders[tp], cfg, path).state_dict()
        for name, tensor in result["merged"].items():
            torch.testing.assert_close(read[name], tensor, rtol=0, atol=1e-6)


@pytest.mark.usefixtures("one_rank_model_parallel")
def test_dropout_only_while_training(tmp_path) -> None:
    """``dropout`` drops the adapter's input (``pre``) or output (``post``) in training only."""
    from transformers import AutoConfig

    from polyrl_engine_megatron.lora import add_adapters
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.transformer_overrides import Recompute

    path = str(tmp_path)
    _hf_model(path)
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, 1)
    (stage,) = pipeline_stages(shape.num_layers, 1)
    x = torch.randn(2, 7, shape.hidden_size)
    for position in ("pre", "post"):
        spec = LoraSpec(
            rank=4,
            alpha=8.0,
            targets=("linear_qkv",),
            dropout=0.5,
            dropout_position=position,
            b_init="normal",
        )
        model = build_gpt_model(
            shape,
            hf_config,
            stage,
            pipeline_parallel=1,
            recompute=Recompute(),
            device=torch.device("cpu"),
        )
        load_hf_weights(model, path, shape, stage, 0, False)
        add_adapters(model, spec, seed=0, global_name=stage.global_name)
        adapter = model.decoder.layers[0].self_attention.linear_qkv.adapter
        adapter.eval()
        expected = spec.scale * (x @ adapter.lora_A.T) @ adapter.lora_B.T
        torch.testing.assert_close(adapter(x), expected.detach())
        adapter.train()
        assert not torch.allclose(adapter(x), expected)


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe"])
@pytest.mark.usefixtures("cpu_router", "one_rank_model_parallel")
def test_experts_and_shared_expert_get_adapters(family: str) -> None:
    """A MoE model's routed experts (and Qwen2-MoE's shared expert) are adapted like dense
    linears; the merged weights, joined into transformers' fused experts, give the adapted
    model's log-probs."""
    from test_megatron_moe import _backward, _model, _to_hf

    from polyrl_engine_megatron.convert import hf_to_megatron, stage_shards
    from polyrl_engine_megatron.lora import add_adapters
    from polyrl_engine_megatron.model import build_gpt_model
    from polyrl_engine_megatron.transformer_overrides import Recompute

    hf_model = _model(family)
    shape = GPTShape.from_hf_config(hf_model.config, 1)
    (stage,) = pipeline_stages(shape.num_layers, 1)
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
    spec = LoraSpec(rank=2, alpha=3.0, targets=SPEC.targets, b_init="normal")
    adapted = add_adapters(model, spec, seed=0, global_name=stage.global_name)
    shared = 2 if family == "qwen2_moe" else 0  # the shared expert's fc1 and fc2
    assert adapted == shape.num_layers * (2 + 2 * shape.moe.num_experts + shared)
    ids = _tokens()
    log_probs = _backward(model, ids, shape)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)

    with torch.no_grad():  # the adapters change the model
        base = _log_probs(hf_model(ids).logits, ids)
    assert (log_probs.detach() - base).abs().max() > 1e-3
    weights = {name: param.detach() for name, param in model.named_parameters()}
    merged = merged_state(weights, spec.scale)
    hf_model.load_state_dict(_to_hf({name: [t] for name, t in merged.items()}, shape))
    with torch.no_grad():
        expected = _log_probs(hf_model(ids).logits, ids)
    torch.testing.assert_close(log_probs.detach(), expected, rtol=1e-5, atol=1e-5)


def _expert_parallel_scenario(rank: int, world: int, path: str) -> dict:
    """A Qwen2-MoE with adapters everywhere (B drawn too, so they change the model) at
    EP=``world``, each rank its own tokens through megatron-core's all-to-all dispatcher; the
    adapters seeded by the model-wide expert numbers, as the engine seeds them; the merged
    weights streamed as the engine streams them (each rank's experts gathered after merging)."""
    from megatron.core import parallel_state
    from test_megatron_moe import _backward, _cpu_moe, _rank_tokens
    from transformers import AutoConfig

    from polyrl_engine_megatron.lora import add_adapters
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.moe import (
        gathered_experts,
        global_expert_name,
        is_expert,
        stack_experts,
    )
    from polyrl_engine_megatron.transformer_overrides import Recompute

    _cpu_moe()
    parallel_state.initialize_model_parallel(
        1, 1, expert_model_parallel_size=world, expert_tensor_parallel_size=1
    )
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, 1)
    (stage,) = pipeline_stages(shape.num_layers, 1)
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
    per_rank = shape.moe.num_experts // world

    def global_name(name: str) -> str:
        return global_expert_name(stage.global_name(name), rank, per_rank)

    spec = LoraSpec(rank=2, alpha=3.0, targets=SPEC.targets, b_init="normal")
    add_adapters(model, spec, seed=0, global_name=global_name)
    log_probs = _backward(model, _rank_tokens(rank), shape)
    group = parallel_state.get_expert_model_parallel_group()
    weights = {}
    local = ((None, name, param.detach()) for name, param in model.named_parameters())
    for _, name, tensor in merge_adapters(
        local, spec.scale, lambda _, module: spec.adapts(global_name(module))
    ):
        pairs = [(name, tensor)]
        if is_expert(name):
            pairs = list(gathered_experts(name, tensor, group, world, per_rank))
        for megatron_name, weight in pairs:
            weights.update(megatron_to_hf(megatron_name, [weight], shape))
    parallel_state.destroy_model_parallel()
    merged = dict(stack_experts(iter(weights.items()), shape.moe.num_experts))
    return {"log_probs": log_probs.detach(), "merged": merged}


def test_expert_parallel_adapters_start_and_merge_alike(tmp_path) -> None:
    """EP=2 starts from the adapters EP=1 draws, and its merged stream (the same on both
    ranks) is the model each rank computed on its own tokens."""
    from test_megatron_moe import _model, _rank_tokens

    path = str(tmp_path / "hf")
    hf_model = _model("qwen2_moe")
    hf_model.save_pretrained(path)
    (one,) = run_on_ranks(_expert_parallel_scenario, 1, path, timeout_s=150)
    two = run_on_ranks(_expert_parallel_scenario, 2, path, timeout_s=150)
    for result in two:
        assert result["merged"].keys() == one["merged"].keys()
        for name, tensor in one["merged"].items():
            torch.testing.assert_close(result["merged"][name], tensor, rtol=0, atol=1e-6)
    hf_model.load_state_dict(one["merged"])
    with torch.no_grad():
        for rank, result in enumerate(two):
            ids = _rank_tokens(rank)
            expected = _log_probs(hf_model(ids).logits, ids)
            torch.testing.assert_close(result["log_probs"], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(two[0]["log_probs"], one["log_probs"], rtol=1e-5, atol=1e-5)
