"""The Megatron engine on CUDA over NCCL, split over 2 GPUs when there are 2 (else 1), by
tensor parallelism and by pipeline parallelism (one decoder layer per stage, the tied
embedding on both): weights stream back exactly as the HF checkpoint has them on every rank,
the log-probs match transformers, resuming repeats an uninterrupted run bitwise, and the
export loads with transformers. Run on the GPU machine with
``pytest -m gpu plugins/engine_megatron``. (Its numbers against fsdp2 and deepspeed are checked by
tests/test_engine_equivalence.py.)"""

from __future__ import annotations

import gc
from functools import partial

import pytest
import torch
from mcore_context import megatron_context

from polyrl.batch import Batch
from polyrl.models.tiny import build_tiny_model
from polyrl_engine_kit.launch import run_on_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
VERL_RECOMPUTE = {
    "recompute_granularity": "full",
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
}
ENGINE = {
    "use_dynamic_bsz": True,
    "ppo_max_token_len_per_gpu": 24,
    "optim": {"lr": 5e-3, "lr_warmup_steps": 2, "lr_scheduler_type": "cosine"},
}


def _world() -> int:
    return 2 if torch.cuda.device_count() >= 2 else 1


def _batch(seed: int) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 400, (6, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[::2, :3] = 0  # left padding on some prompts
    mask[1::2, -2:] = 0  # right padding on some responses
    return Batch(
        {
            "input_ids": ids * mask,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": (ids * mask)[:, 6:].clone(),
            "response_mask": mask[:, 6:].clone(),
        }
    )


def noisy_loss(micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None):
    mask = micro["response_mask"].float() * torch.rand(log_prob.shape, device=log_prob.device)
    return -(log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"], {}


def _weights(engine) -> dict[str, torch.Tensor]:
    return {name: tensor.cpu().clone() for name, tensor in engine.named_weights()}


def _scenario(rank: int, world: int, path: str, ckpt: str, export: str, split: str) -> dict:
    from polyrl_engine_megatron.engine import MegatronEngine

    sizes = {"tensor_parallel": world} if split == "tp" else {"pipeline_parallel": world}

    def build() -> MegatronEngine:
        ctx = megatron_context(path, engine=ENGINE, rank=rank, world_size=world, **sizes)
        return MegatronEngine(ctx)

    batches = [_batch(seed) for seed in range(4)]  # TP peers get the same rows
    first = build()
    out: dict = {"initial": _weights(first), "log_prob": first.compute_log_prob(batches[0])[0]}
    out["returns_output"] = first.data_parallel_rank().returns_output
    for batch in batches[:2]:
        first.train_step(batch, noisy_loss)
    first.save_checkpoint(ckpt)
    for batch in batches[2:]:
        first.train_step(batch, noisy_loss)
    out["w1"] = _weights(first)
    first.export_hf(export)
    del first
    torch.manual_seed(1234)
    second = build()
    second.load_checkpoint(ckpt)
    for batch in batches[2:]:
        second.train_step(batch, noisy_loss)
    out["w2"] = _weights(second)
    out["step"] = second.global_step
    return out


SPLITS = [
    "tp",
    pytest.param(
        "pp",
        marks=pytest.mark.skipif(
            torch.cuda.device_count() < 2, reason="pipeline stages need 2 CUDA devices"
        ),
    ),
]


@pytest.fixture(scope="module", params=SPLITS)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(f"mcore_{request.param}")
    path = build_tiny_model(str(root / "tiny"))
    export = str(root / "export")
    results = run_on_ranks(
        _scenario,
        _world(),
        path,
        str(root / "ckpt"),
        export,
        request.param,
        backend="nccl",
        timeout_s=600,
    )
    return path, export, results


def test_weights_stream_back_as_the_hf_checkpoint(run) -> None:
    from transformers import AutoModelForCausalLM

    path, _, results = run
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    for rank in results:
        assert rank["initial"].keys() == hf.keys()
        for name, tensor in hf.items():
            assert torch.equal(rank["initial"][name], tensor), name


def test_log_probs_match_transformers(run) -> None:
    from transformers import AutoModelForCausalLM

    path, _, results = run
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    batch = _batch(0)
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits[:, 5:-1]
    log_p = torch.log_softmax(logits.float(), dim=-1)
    expected = log_p.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    expected = expected * batch["response_mask"]
    returning = [rank for rank in results if rank["returns_output"]]
    assert len(returning) == 1
    torch.testing.assert_close(returning[0]["log_prob"], expected, rtol=0.02, atol=0.05)


def _float32_log_probs(rank: int, world: int, path: str, remove_padding: bool) -> torch.Tensor:
    from polyrl_engine_megatron.engine import MegatronEngine

    ctx = megatron_context(
        path, engine=ENGINE, dtype="float32", remove_padding=remove_padding, world_size=world
    )
    log_prob, entropy = MegatronEngine(ctx).compute_log_prob(_batch(0), calculate_entropy=True)
    assert entropy is not None and bool((entropy[_batch(0)["response_mask"].bool()] > 0).all())
    return log_prob


@pytest.mark.parametrize("remove_padding", [True, False], ids=["packed", "padded"])
def test_float32_log_probs_match_transformers_closely(tmp_path, remove_padding: bool) -> None:
    """In float32 the packed row (positions restarting with each sequence, attention kept
    inside it, fused log-probs) and the padded rows both give transformers' numbers to float32
    rounding: a misplaced rotary position or a leak across sequences would be off by far more."""
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(str(tmp_path / "tiny"))
    (log_prob,) = run_on_ranks(
        _float32_log_probs, 1, path, remove_padding, backend="nccl", timeout_s=300
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    batch = _batch(0)
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits[:, 5:-1]
    expected = torch.log_softmax(logits, dim=-1).gather(-1, batch["responses"].unsqueeze(-1))
    expected = expected.squeeze(-1) * batch["response_mask"]
    torch.testing.assert_close(log_prob, expected, rtol=1e-4, atol=1e-4)


def test_resume_is_bitwise_identical(run) -> None:
    _, _, results = run
    for rank in results:
        assert rank["step"] == 4
        for name, tensor in rank["w1"].items():
            assert torch.equal(tensor, rank["w2"][name]), name


def test_export_loads_with_transformers(run) -> None:
    from transformers import AutoModelForCausalLM

    _, export, results = run
    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    state = model.state_dict()
    for name, tensor in results[0]["w1"].items():
        torch.testing.assert_close(state[name], tensor.to(torch.bfloat16).float(), rtol=0, atol=0)


def response_log_likelihood(micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None):
    mask = micro["response_mask"].to(log_prob.dtype)
    return -(log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"], {}


def _checkpointing_scenario(rank: int, world: int, path: str) -> dict:
    """One training step on the same batch without and with gradient checkpointing (pipeline
    stages over the GPUs when there are 2): its metrics, the weights after it, and how often the
    layers' attention ran in it."""
    from polyrl_engine_megatron.engine import MegatronEngine

    engine_keys = {**ENGINE, "optim": {"lr": 5e-3}}  # no warm-up: the first step moves weights
    calls = dict.fromkeys((False, True, "override"), 0)

    def count(checkpointed: bool | str, *_) -> None:
        calls[checkpointed] += 1

    out = {}
    for checkpointed in (False, True, "override"):
        ctx = megatron_context(
            path,
            engine=engine_keys,
            rank=rank,
            world_size=world,
            pipeline_parallel=world,
            gradient_checkpointing=checkpointed is True,
            megatron={"override_transformer_config": VERL_RECOMPUTE}
            if checkpointed == "override"
            else None,
        )
        engine = MegatronEngine(ctx)
        for layer in engine.model.decoder.layers:
            layer.self_attention.register_forward_pre_hook(partial(count, checkpointed))
        metrics = engine.train_step(_batch(0), response_log_likelihood)
        out[checkpointed] = {
            "metrics": metrics,
            "weights": _weights(engine),
            "attention_calls": calls[checkpointed],
        }
        del engine
    return out


def test_gradient_checkpointing_recomputes_the_same_bf16_step(tmp_path) -> None:
    """The checkpointed step runs each layer's attention twice (forward, then the recompute in
    the backward) and reaches the same gradient norm and weights: the recompute runs under the
    forward's bf16 autocast (megatron-core's own recompute would redo it in float32). verl's
    recompute keys in ``megatron.override_transformer_config`` (full, uniform, 1 layer) do the
    same."""
    path = build_tiny_model(str(tmp_path / "tiny"))
    results = run_on_ranks(_checkpointing_scenario, _world(), path, backend="nccl", timeout_s=600)
    for rank in results:
        plain = rank[False]
        assert plain["attention_calls"] > 0
        for checkpointed in (rank[True], rank["override"]):
            assert checkpointed["attention_calls"] == 2 * plain["attention_calls"]
            assert checkpointed["metrics"]["actor/grad_norm"] == pytest.approx(
                plain["metrics"]["actor/grad_norm"], rel=1e-5
            )
            for name, tensor in plain["weights"].items():
                torch.testing.assert_close(checkpointed["weights"][name], tensor, rtol=0, atol=1e-6)


def _offload_scenario(rank: int, world: int, path: str, ckpt: str) -> dict:
    """The same log-probs, steps and checkpoint without and with verl's Megatron CPU offload
    (tensor parallelism over the GPUs when there are 2); where the weights and the AdamW
    moments are between calls, and the GPU memory they leave free."""
    from polyrl_engine_megatron.engine import MegatronEngine

    out = {}
    for offload in (False, True):
        # what this engine holds on the GPU, whatever an earlier one left there
        gc.collect()
        torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated()
        keys = dict.fromkeys(("param_offload", "grad_offload", "optimizer_offload"), offload)
        ctx = megatron_context(
            path, engine=ENGINE, rank=rank, world_size=world, tensor_parallel=world, megatron=keys
        )
        torch.manual_seed(0)
        engine = MegatronEngine(ctx)
        run: dict = {"log_prob": engine.compute_log_prob(_batch(0))[0]}
        for seed in range(1, 3):
            run[f"metrics{seed}"] = engine.train_step(_batch(seed), noisy_loss)
        run["between"] = {
            "params": {p.device.type for p in engine.model.parameters()},
            "moments": {
                v.device.type
                for state in engine.optimizer.state.values()
                for k, v in state.items()
                if k != "step"
            },
            "allocated": torch.cuda.memory_allocated() - start,
        }
        engine.save_checkpoint(f"{ckpt}_{offload}")
        run["after_save"] = {p.device.type for p in engine.model.parameters()}
        run["weights"] = _weights(engine)
        run["log_prob_after"] = engine.compute_log_prob(_batch(0))[0]
        out[offload] = run
        del engine
        torch.cuda.empty_cache()
    return out


def test_megatron_cpu_offload_changes_where_not_what(tmp_path) -> None:
    """verl's ``megatron.{param,grad,optimizer}_offload``: log-probs, steps, streamed weights
    bitwise the same as without offload; between calls the weights and AdamW's moments are in
    host memory and the GPU holds less."""
    path = build_tiny_model(str(tmp_path / "tiny"))
    results = run_on_ranks(
        _offload_scenario, _world(), path, str(tmp_path / "ckpt"), backend="nccl", timeout_s=600
    )
    for rank in results:
        plain, offloaded = rank[False], rank[True]
        for key in ("log_prob", "log_prob_after"):
            torch.testing.assert_close(offloaded[key], plain[key], rtol=0, atol=0)
        for seed in (1, 2):  # the peak memory differs, the step does not
            same = {k: v for k, v in plain[f"metrics{seed}"].items() if "memory" not in k}
            assert {k: offloaded[f"metrics{seed}"][k] for k in same} == same
        for name, tensor in plain["weights"].items():
            torch.testing.assert_close(offloaded["weights"][name], tensor, rtol=0, atol=0)
        assert plain["between"]["params"] == {"cuda"}
        assert offloaded["between"]["params"] == {"cpu"} == offloaded["after_save"]
        assert offloaded["between"]["moments"] == {"cpu"}
        assert offloaded["between"]["allocated"] < plain["between"]["allocated"]
