"""Hybrid sharding (verl's ``fsdp_config.fsdp_size``) on 2 CPU ranks over gloo: with
``fsdp_size=1`` each rank holds the whole model (a 2-D mesh: replicated across 2 groups of one,
sharded within each), and training gives the same losses, gradient norms and weights as
sharding over both ranks (``fsdp_size=-1``)."""

from __future__ import annotations

import pytest
import torch
from test_fsdp_engine import WORLD, _ctx, _full_batch, _shard, mean_logprob_loss

from polyrl_engine_kit.launch import run_on_ranks


def _scenario_sizes(rank: int, world: int, path: str, ckpt_dir: str) -> dict:
    from torch.distributed.tensor import Replicate, Shard

    from polyrl_engine_fsdp.engine import FSDPEngine

    out: dict = {}
    for size in (-1, 1):
        fsdp = {"mixed_precision": False, "reshard_after_forward": True, "fsdp_size": size}
        engine = FSDPEngine(_ctx(rank, path, fsdp_config=fsdp))
        param = next(engine.model.parameters())
        hybrid = param.device_mesh.ndim == 2 and tuple(param.placements) == (Replicate(), Shard(0))
        metrics = [
            engine.train_step(_shard(_full_batch(seed=s), rank), mean_logprob_loss) for s in (0, 1)
        ]
        out[size] = {
            "hybrid": hybrid,
            "local_rows": param.to_local().shape[0],
            "rows": param.shape[0],
            "metrics": metrics,
            "weights": {k: v.clone() for k, v in engine.named_weights()},
        }
        if size == 1:
            engine.save_checkpoint(ckpt_dir)
        del engine
    # a hybrid-sharded checkpoint loads into a fully sharded engine (DCP reshards)
    fsdp = {"mixed_precision": False, "reshard_after_forward": True, "fsdp_size": -1}
    resumed = FSDPEngine(_ctx(rank, path, fsdp_config=fsdp))
    resumed.load_checkpoint(ckpt_dir)
    out["resumed"] = {k: v.clone() for k, v in resumed.named_weights()}
    return out


@pytest.fixture(scope="module")
def sizes(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    from fsdp_tiny_model import build_tiny_model

    path = build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "tied"), tie=True, seed=0)
    ckpt_dir = str(tmp_path_factory.mktemp("hsdp_ckpt"))
    return run_on_ranks(_scenario_sizes, WORLD, path, ckpt_dir, timeout_s=240)


def test_fsdp_size_one_replicates_whole_shards(sizes: list[dict]) -> None:
    for result in sizes:
        assert result[1]["hybrid"] and result[1]["local_rows"] == result[1]["rows"]
        assert not result[-1]["hybrid"] and result[-1]["local_rows"] < result[-1]["rows"]


def test_hybrid_sharding_trains_as_full_sharding(sizes: list[dict]) -> None:
    for result in sizes:
        full, hybrid = result[-1], result[1]
        for a, b in zip(full["metrics"], hybrid["metrics"], strict=True):
            assert b["actor/pg_loss"] == pytest.approx(a["actor/pg_loss"], rel=1e-5)
            assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)
        assert full["weights"].keys() == hybrid["weights"].keys()
        for name, weight in full["weights"].items():
            torch.testing.assert_close(hybrid["weights"][name], weight, rtol=1e-4, atol=1e-5)
    # both ranks hold the same (replicated) weights
    for name, weight in sizes[0][1]["weights"].items():
        torch.testing.assert_close(sizes[1][1]["weights"][name], weight)


def test_a_hybrid_checkpoint_loads_fully_sharded(sizes: list[dict]) -> None:
    for result in sizes:
        for name, weight in result[1]["weights"].items():
            torch.testing.assert_close(result["resumed"][name], weight, rtol=0, atol=0)
