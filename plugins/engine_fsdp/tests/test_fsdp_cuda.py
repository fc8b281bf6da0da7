"""The FSDP2 engine on CUDA over NCCL (1 or 2 GPUs): run on the GPU machine with
``pytest -m gpu plugins/engine_fsdp``. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import os

import pytest
import torch
from test_fsdp_engine import (
    _ctx,
    _full_batch,
    _hf_logprob_entropy,
    _hf_model,
    mean_logprob_loss,
    tiny_models,  # noqa: F401 - the fixture
)

from polyrl.batch import Batch
from polyrl_engine_kit.launch import run_on_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _world() -> int:
    return 2 if torch.cuda.device_count() >= 2 else 1


def _rows(batch: Batch, rank: int, world: int) -> Batch:
    return batch.chunk(world)[rank]


def _cuda_ctx(rank: int, world: int, path: str, **overrides: object) -> object:
    """test_fsdp_engine's context on CUDA, for this machine's world size (1 or 2 GPUs)."""
    ctx = _ctx(rank, path, device="cuda", **overrides)
    ctx.world_size = world
    return ctx


def _scenario_cuda(rank: int, world: int, path: str, ckpt_dir: str, export_dir: str) -> dict:
    from polyrl_engine_fsdp.engine import FSDPEngine

    batch = _rows(_full_batch(), rank, world)
    out: dict = {}
    exact = FSDPEngine(_cuda_ctx(rank, world, path))
    out["lp_fp32"], out["ent_fp32"] = exact.compute_log_prob(batch, calculate_entropy=True)
    del exact
    ctx = _cuda_ctx(
        rank,
        world,
        path,
        mixed_precision=True,
        gradient_checkpointing=True,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=20,
    )
    engine = FSDPEngine(ctx)
    out["lp_bf16"], _ = engine.compute_log_prob(batch)
    out["metrics"] = [engine.train_step(batch, mean_logprob_loss) for _ in range(3)]
    out["lp_trained"], _ = engine.compute_log_prob(batch)
    engine.save_checkpoint(ckpt_dir)
    engine.train_step(batch, mean_logprob_loss)
    engine.load_checkpoint(ckpt_dir)
    out["lp_restored"], _ = engine.compute_log_prob(batch)
    weights = dict(engine.named_weights())
    out["weight_devices"] = sorted({t.device.type for t in weights.values()})
    out["embed"] = weights["model.embed_tokens.weight"].cpu()
    engine.export_hf(export_dir)
    return out


def test_engine_on_cuda(tiny_models, tmp_path):  # noqa: F811 - pytest fixture injection
    world = _world()
    export_dir = str(tmp_path / "hf")
    results = run_on_ranks(
        _scenario_cuda,
        world,
        tiny_models["tied"],
        str(tmp_path / "ckpt"),
        export_dir,
        backend="nccl",
        timeout_s=300,
    )
    with torch.no_grad():
        lp_ref, ent_ref = _hf_logprob_entropy(_hf_model(tiny_models["tied"]), _full_batch())
    lp_ref, ent_ref = lp_ref.chunk(world), ent_ref.chunk(world)
    mask_all = _full_batch()["response_mask"].bool().chunk(world)
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["lp_fp32"], lp_ref[rank], atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(r["ent_fp32"], ent_ref[rank], atol=2e-4, rtol=1e-4)
        mask = mask_all[rank]
        # bf16 compute: close to the fp32 log-probs, not equal
        assert (r["lp_bf16"][mask] - lp_ref[rank][mask]).abs().mean() < 0.05
        assert r["lp_trained"][mask].mean() > r["lp_bf16"][mask].mean()
        losses = [m["actor/pg_loss"] for m in r["metrics"]]
        assert losses[0] > losses[-1]
        torch.testing.assert_close(r["lp_restored"], r["lp_trained"], atol=1e-5, rtol=0)
        assert r["weight_devices"] == ["cuda"]
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(export_dir)
    assert loaded.dtype == torch.bfloat16
    assert torch.equal(loaded.model.embed_tokens.weight, results[0]["embed"].to(torch.bfloat16))
    assert os.path.isfile(os.path.join(export_dir, "tokenizer.json"))
