"""Cross-engine equivalence on CPU: the same HF model, config and batch through fsdp2 and deepspeed
(ZeRO-1, 2 and 3) give the same log-probs, entropy, loss and grad norm, and the same weights after
one optimizer step.

Two ranks over gloo in float32, so the only differences are the order of floating-point sums
(FSDP reduce-scatters per layer, ZeRO flattens and partitions): tolerances are tight. The token
budget and an uneven split give rank 0 more micro-batches than rank 1, so both engines'
equal-count logic (split groups, then zero-weight dummy passes) is part of what must agree;
gradient clipping, weight decay and the first warm-up step of the LR schedule are active.
"""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch

from polyrl.batch import Batch
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import composed_context, ragged_batch

# Located, not imported: collecting this file must not load DeepSpeed into the test process.
pytestmark = pytest.mark.skipif(
    find_spec("deepspeed") is None, reason="pip install 'polyrl-engine-deepspeed[cpu]'"
)

WORLD = 2
STAGES = (1, 2, 3)
PROMPT_W, RESP_W = 6, 7
# rank 0 gets rows 0-4, each alone in a micro-batch under the 13-token budget; rank 1 gets
# rows 5-7, so it splits them into 3 micro-batches and adds 2 dummy passes.
SHARDS = ([0, 1, 2, 3, 4], [5, 6, 7])
PROMPT_LENS = [6, 5, 6, 4, 2, 3, 1, 2]
RESP_LENS = [7, 6, 5, 7, 2, 1, 3, 2]
TEMPERATURE = 0.7


def _model(path: str) -> str:
    """polyrl's tiny Qwen2 (tied embeddings) with larger weights, so that log-probs differ
    visibly between tokens and the gradients are not tiny."""
    from transformers import AutoModelForCausalLM

    from polyrl.models.tiny import build_tiny_model

    build_tiny_model(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.08)
    model.save_pretrained(path)
    return path


def _batch() -> Batch:
    generator = torch.Generator().manual_seed(0)
    return ragged_batch(PROMPT_LENS, RESP_LENS, PROMPT_W, RESP_W, generator)


def _context(
    rank: int,
    path: str,
    strategy: str,
    zero_stage: int = 2,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    world: int = WORLD,
    remove_padding: bool = True,
):
    """The same run config for every engine; only the strategy (and its own section) differs."""
    actor = {
        "strategy": strategy,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 13,
        "optim": {
            "lr": 5e-3,
            "betas": [0.9, 0.99],
            "weight_decay": 0.1,
            "clip_grad": 1.0,
            "lr_warmup_steps": 2,
        },
        "fsdp_config": {"mixed_precision": dtype != "float32"},
        "megatron": {
            "tensor_model_parallel_size": tensor_parallel,
            "pipeline_model_parallel_size": pipeline_parallel,
        },
    }
    return composed_context(
        path,
        model={"dtype": dtype, "use_remove_padding": remove_padding},
        actor=actor,
        plugins={"deepspeed": {"zero_stage": zero_stage}},
        device=device,
        rank=rank,
        world_size=world,
        seed=5,
    )


def _token_mean_loss(micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None):
    """A policy-gradient-like loss: token-mean of advantage-weighted log-probs over this rank's
    mini-batch, with signs that differ by row."""
    mask = micro["response_mask"].to(log_prob.dtype)
    sign = torch.where(micro["responses"][:, :1] % 2 == 0, 1.0, -1.0).to(log_prob.device)
    loss = -(sign * log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"]
    return loss, {"actor/pg_loss": float(loss.detach())}


def _run(engine, batch: Batch) -> dict:
    log_prob, entropy = engine.compute_log_prob(
        batch, temperature=TEMPERATURE, calculate_entropy=True
    )
    metrics = engine.train_step(batch, _token_mean_loss, temperature=TEMPERATURE)
    weights = {name: tensor.detach().cpu().clone() for name, tensor in engine.named_weights()}
    after, _ = engine.compute_log_prob(batch, temperature=TEMPERATURE)
    return {
        "log_prob": log_prob,
        "entropy": entropy,
        "metrics": metrics,
        "weights": weights,
        "after": after,
    }


def _scenario(rank: int, world: int, path: str) -> dict:
    from polyrl_engine_deepspeed.engine import DeepSpeedEngine
    from polyrl_engine_fsdp.engine import FSDPEngine

    batch = _batch().select_rows(SHARDS[rank])
    out = {"fsdp2": _run(FSDPEngine(_context(rank, path, "fsdp2", 2)), batch)}
    for stage in STAGES:
        engine = DeepSpeedEngine(_context(rank, path, "deepspeed", stage))
        out[f"zero{stage}"] = _run(engine, batch)
        out[f"zero{stage}"]["dummies"] = engine._micro_batches(batch, training=True)[1]
        del engine
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    path = _model(str(tmp_path_factory.mktemp("equivalence") / "tiny"))
    return run_on_ranks(_scenario, WORLD, path, timeout_s=600)


@pytest.mark.parametrize("stage", STAGES)
def test_log_probs_and_entropy_match(results: list[dict], stage: int) -> None:
    for rank in results:
        fsdp, ds = rank["fsdp2"], rank[f"zero{stage}"]
        torch.testing.assert_close(ds["log_prob"], fsdp["log_prob"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ds["entropy"], fsdp["entropy"], rtol=1e-5, atol=1e-5)
        assert (fsdp["log_prob"] != 0).any()


@pytest.mark.parametrize("stage", STAGES)
def test_loss_grad_norm_and_lr_match(results: list[dict], stage: int) -> None:
    for rank in results:
        fsdp, ds = rank["fsdp2"]["metrics"], rank[f"zero{stage}"]["metrics"]
        assert ds["actor/pg_loss"] == pytest.approx(fsdp["actor/pg_loss"], rel=1e-5, abs=1e-6)
        assert ds["actor/grad_norm"] == pytest.approx(fsdp["actor/grad_norm"], rel=1e-5)
        assert ds["actor/lr"] == fsdp["actor/lr"] == pytest.approx(2.5e-3)
    # clipping is part of what is compared, and the token budget made rank 1 pad with a dummy
    assert results[0]["fsdp2"]["metrics"]["actor/grad_norm"] > 1.0
    assert results[1][f"zero{stage}"]["dummies"] > 0


@pytest.mark.parametrize("stage", STAGES)
def test_weights_after_one_step_match(results: list[dict], stage: int) -> None:
    fsdp, ds = results[0]["fsdp2"]["weights"], results[0][f"zero{stage}"]["weights"]
    assert ds.keys() == fsdp.keys()
    # AdamW's first step moves each weight by about lr x g / (|g| + eps): where a gradient entry
    # is near zero (k_proj's bias, whose exact gradient is 0), its summation-order noise reaches
    # the update. So: all but 2e-4 of the entries agree to 1e-6 (weight decay alone moves them by
    # 2e-5, so its absence would show), and none differs by more than 5% of one step (measured:
    # 16 of 443776 entries beyond 1e-6, at most 9e-5, under ZeRO-3 with both engines padded; 54
    # with fsdp2's packed rows, whose attention sums in another order).
    lr = results[0]["fsdp2"]["metrics"]["actor/lr"]
    beyond = sum(int(((ds[name] - tensor).abs() > 1e-6).sum()) for name, tensor in fsdp.items())
    assert beyond <= 2e-4 * sum(tensor.numel() for tensor in fsdp.values())
    for name, tensor in fsdp.items():
        torch.testing.assert_close(ds[name], tensor, rtol=0, atol=0.05 * lr, msg=name)
    for rank in results:
        after, before = rank[f"zero{stage}"]["after"], rank[f"zero{stage}"]["log_prob"]
        torch.testing.assert_close(after, rank["fsdp2"]["after"], rtol=1e-4, atol=1e-4)
        assert not torch.equal(after, before)


# ---- CUDA, bf16: fsdp2, deepspeed and megatron (1 GPU), megatron with TP=2 (2 GPUs) ------------
# Run on the GPU machine: ``pytest -m gpu tests/test_engine_equivalence.py``. bf16 compute with
# float32 master weights in all three; the tolerances are bf16's (about 3 significant digits).
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ENGINES_CUDA = ("zero1", "zero2", "zero3", "megatron", "megatron_padded")


def _scenario_cuda(rank: int, world: int, path: str) -> dict:
    """One GPU, the whole batch: every engine on the same model, config and rows."""
    from polyrl_engine_deepspeed.engine import DeepSpeedEngine
    from polyrl_engine_fsdp.engine import FSDPEngine
    from polyrl_engine_megatron.engine import MegatronEngine

    batch = _batch()
    cuda = {"device": "cuda", "dtype": "bfloat16", "world": world}
    out = {"fsdp2": _run(FSDPEngine(_context(rank, path, "fsdp2", **cuda)), batch)}
    for stage in STAGES:
        out[f"zero{stage}"] = _run(
            DeepSpeedEngine(_context(rank, path, "deepspeed", stage, **cuda)), batch
        )
    # megatron: packed rows and fused log-probs (the defaults), then padded rows
    out["megatron"] = _run(MegatronEngine(_context(rank, path, "megatron", **cuda)), batch)
    padded = _context(rank, path, "megatron", remove_padding=False, **cuda)
    out["megatron_padded"] = _run(MegatronEngine(padded), batch)
    return out


def _scenario_split(rank: int, world: int, path: str, split: str) -> dict:
    """Two GPUs holding one copy of the model (TP=2, or PP=2: one decoder layer per stage, the
    tied embedding on both; one data-parallel rank): both ranks get the whole batch, as the
    driver gives it to model-parallel peers."""
    from polyrl_engine_megatron.engine import MegatronEngine

    sizes = {"pipeline_parallel": 2} if split == "pp2" else {"tensor_parallel": 2}
    # tp2: packed rows, vocab-parallel fused log-probs; tp2_padded: the output layer's logits
    remove_padding = split != "tp2_padded"
    ctx = _context(
        rank,
        path,
        "megatron",
        device="cuda",
        dtype="bfloat16",
        world=world,
        remove_padding=remove_padding,
        **sizes,
    )
    engine = MegatronEngine(ctx)
    out = _run(engine, _batch())
    out["mesh"] = engine.data_parallel_rank()
    return out


@pytest.fixture(scope="module")
def cuda_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = _model(str(tmp_path_factory.mktemp("equivalence_cuda") / "tiny"))
    (one,) = run_on_ranks(_scenario_cuda, 1, path, backend="nccl", timeout_s=600)
    return one


def _assert_bf16_close(engine: dict, reference: dict) -> None:
    lp, ref_lp = engine["log_prob"], reference["log_prob"]
    torch.testing.assert_close(lp, ref_lp, rtol=0.02, atol=0.05)
    assert (lp - ref_lp).abs().mean() < 0.01
    torch.testing.assert_close(engine["entropy"], reference["entropy"], rtol=0.02, atol=0.05)
    metrics, ref_metrics = engine["metrics"], reference["metrics"]
    assert metrics["actor/pg_loss"] == pytest.approx(ref_metrics["actor/pg_loss"], rel=0.01)
    assert metrics["actor/grad_norm"] == pytest.approx(ref_metrics["actor/grad_norm"], rel=0.03)
    assert metrics["actor/lr"] == ref_metrics["actor/lr"]
    # AdamW's first step moves a weight by about lr x sign(g): bf16 noise may flip the sign of
    # a near-zero gradient entry (a 2 lr difference), but not of many.
    lr = ref_metrics["actor/lr"]
    weights, ref_weights = engine["weights"], reference["weights"]
    assert weights.keys() == ref_weights.keys()
    far = sum(
        int(((weights[n].float() - t).abs() > 0.2 * lr).sum()) for n, t in ref_weights.items()
    )
    assert far <= 0.01 * sum(t.numel() for t in ref_weights.values())
    for name, tensor in ref_weights.items():
        torch.testing.assert_close(weights[name].float(), tensor, rtol=0, atol=2.5 * lr)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("engine", ENGINES_CUDA)
def test_cuda_bf16_engines_match_fsdp2(cuda_results: dict, engine: str) -> None:
    _assert_bf16_close(cuda_results[engine], cuda_results["fsdp2"])


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("split", ["tp2", "tp2_padded", "pp2"])
def test_cuda_megatron_split_matches_fsdp2(cuda_results: dict, tmp_path, split: str) -> None:
    """The output comes from the first TP rank (TP=2) or the last stage (PP=2), whose loss
    metrics are the step's; every rank streams the whole model and reports the global grad
    norm."""
    path = _model(str(tmp_path / "tiny"))
    results = run_on_ranks(_scenario_split, 2, path, split, backend="nccl", timeout_s=600)
    returning = [r["mesh"].returns_output for r in results]
    assert returning == ([False, True] if split == "pp2" else [True, False])
    assert {(r["mesh"].dp_rank, r["mesh"].dp_size) for r in results} == {(0, 1)}
    reference = cuda_results["fsdp2"]
    _assert_bf16_close(results[returning.index(True)], reference)
    for rank in results:
        assert rank["metrics"]["actor/grad_norm"] == pytest.approx(
            reference["metrics"]["actor/grad_norm"], rel=0.03
        )
        assert rank["weights"].keys() == reference["weights"].keys()
        for name, tensor in results[0]["weights"].items():
            assert torch.equal(rank["weights"][name], tensor), name
