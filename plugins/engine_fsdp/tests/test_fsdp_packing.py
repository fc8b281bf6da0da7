"""The FSDP engine with padding-free packing and fused log-probs against its padded path (one
rank, in-process); the packing and fused maths alone are tested in polyrl-engine-kit."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from polyrl.batch import Batch
from polyrl_engine_kit.testing import (
    composed_context,
    ragged_batch,
    record_stepped_gradients,
    tiny_model,
)

torch.set_num_threads(1)


def _policy_loss(
    micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None
) -> tuple[torch.Tensor, dict[str, float]]:
    mask = micro["response_mask"].float()
    tokens = micro.meta["mini_batch_response_tokens"]
    loss = -(log_prob * micro["advantages"] * mask).sum() / tokens
    if entropy is not None:  # needs_entropy_grad: the entropy carries grad
        loss = loss - 0.1 * (entropy * mask).sum() / tokens
    return loss, {"actor/pg_loss": float(loss.detach())}


_policy_loss.needs_entropy_grad = True  # type: ignore[attr-defined]


def _run_engine(model: dict, device: str = "cpu", compiled: bool = True) -> dict[str, object]:
    from polyrl_engine_fsdp.engine import FSDPEngine

    gen = torch.Generator().manual_seed(0)
    batch = ragged_batch([5, 2, 4, 1, 3, 5], [4, 6, 1, 3, 6, 2], 5, 6, gen)
    batch["advantages"] = torch.randn(6, 6, generator=gen)
    mixed = device == "cuda"
    ctx = composed_context(
        tiny_model("packing_"),
        model={"dtype": "bfloat16" if mixed else "float32", **model},
        actor={
            "ppo_micro_batch_size_per_gpu": 4,
            "optim": {"lr": 1e-2},
            "fsdp_config": {"mixed_precision": mixed},
            "use_torch_compile": compiled,
        },
        device=device,
    )
    engine = FSDPEngine(ctx)
    stepped = record_stepped_gradients(engine.model, engine.optimizer)
    try:
        log_prob, entropy = engine.compute_log_prob(batch, temperature=0.8, calculate_entropy=True)
        metrics = engine.train_step(batch, _policy_loss, temperature=0.8)
        return {"paths": engine.paths, "lp": log_prob, "ent": entropy, "m": metrics, "g": stepped}
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def padded_run() -> dict[str, object]:
    assert not dist.is_initialized()
    return _run_engine({"use_remove_padding": False})


@pytest.mark.parametrize("fused", [True, False])
def test_packed_engine_matches_padded(padded_run: dict, fused: bool) -> None:
    run = _run_engine({"use_fused_kernels": fused})
    assert run["paths"].packed and run["paths"].fused == fused
    torch.testing.assert_close(run["lp"], padded_run["lp"], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(run["ent"], padded_run["ent"], atol=2e-5, rtol=1e-5)
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert run["m"][key] == pytest.approx(padded_run["m"][key], rel=1e-5), key
    assert run["g"].keys() == padded_run["g"].keys()
    for name, grad in run["g"].items():  # the gradients the optimizer steps on
        reference = padded_run["g"][name]
        atol = 3e-5 * float(reference.abs().max())  # measured: within 1.2e-6 of the largest
        torch.testing.assert_close(grad, reference, atol=atol, rtol=1e-5, msg=name)


@pytest.fixture(scope="module")
def cuda_padded_run() -> dict[str, object]:
    plain = {"use_remove_padding": False, "use_liger": False, "use_fused_kernels": False}
    return _run_engine(plain, "cuda", compiled=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger, Inductor and varlen need CUDA")
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-layers", "liger"])
def test_cuda_fast_paths_match_padded(cuda_padded_run: dict, compiled: bool) -> None:
    """Packed rows in varlen flash attention and fused log-probs, with the decoder layers
    compiled by Inductor (the default) or patched with Liger's kernels, against the padded
    eager path."""
    if not compiled:
        pytest.importorskip("liger_kernel", reason="liger-kernel is the [cuda] extra")
    padded = cuda_padded_run
    fast = _run_engine({}, "cuda", compiled=compiled)
    paths = fast["paths"]
    assert paths.packed and paths.fused and paths.compiled == compiled and paths.liger != compiled
    close = {"atol": 0.05, "rtol": 0.02}  # bf16 compute on both sides
    torch.testing.assert_close(fast["lp"], padded["lp"], **close)
    torch.testing.assert_close(fast["ent"], padded["ent"], **close)
    assert (fast["lp"] - padded["lp"]).abs().mean() < 0.01
    assert fast["m"]["actor/grad_norm"] == pytest.approx(padded["m"]["actor/grad_norm"], rel=0.03)
