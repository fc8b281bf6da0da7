"""The frozen reference engine keeps its weights in the compute dtype (issue 25, item 4).

Under mixed precision the actor holds fp32 master weights that FSDP2 casts to bf16 on every
gather; the reference (``role="ref"``, not trainable) holds the bf16 weights themselves. Its
log-probs must be the ones the cast path gives: the same bf16 values go through the same
kernels. One CPU rank over gloo."""

from __future__ import annotations

import pytest
import torch
from test_fsdp_engine import _ctx, _full_batch

from polyrl.api import EngineContext


def _mixed_ctx(rank: int, world: int, path: str, role: str) -> EngineContext:
    ctx = _ctx(rank, path, mixed_precision=True)
    ctx.world_size, ctx.role, ctx.trainable = world, role, role != "ref"
    return ctx


def _scenario(rank: int, world: int, path: str) -> dict:
    from polyrl_engine_fsdp.engine import FSDPEngine

    batch = _full_batch()
    out: dict = {}
    # the actor's path: fp32 master weights, bf16 compute through FSDP2's mixed precision
    actor = FSDPEngine(_mixed_ctx(rank, world, path, "actor"))
    out["actor_params"] = {p.dtype for p in actor.model.parameters()}
    out["actor_lp"], out["actor_ent"] = actor.compute_log_prob(
        batch, temperature=0.7, calculate_entropy=True
    )
    del actor
    ref = FSDPEngine(_mixed_ctx(rank, world, path, "ref"))
    out["ref_params"] = {p.dtype for p in ref.model.parameters()}
    out["ref_buffers"] = {b.dtype for b in ref.model.buffers() if b.is_floating_point()}
    out["ref_lp"], out["ref_ent"] = ref.compute_log_prob(
        batch, temperature=0.7, calculate_entropy=True
    )
    return out


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from fsdp_tiny_model import scenario_on_one_rank

    return scenario_on_one_rank(tmp_path_factory, _scenario)


def test_reference_holds_compute_dtype_weights(result: dict) -> None:
    assert result["actor_params"] == {torch.float32}
    assert result["ref_params"] == {torch.bfloat16}
    assert result["ref_buffers"] == {torch.float32}  # rotary frequencies, as under the cast


def test_reference_log_probs_equal_the_cast_paths(result: dict) -> None:
    assert torch.count_nonzero(result["actor_lp"]) > 0
    assert torch.equal(result["ref_lp"], result["actor_lp"])
    assert torch.equal(result["ref_ent"], result["actor_ent"])
