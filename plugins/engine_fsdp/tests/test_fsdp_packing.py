"""Padding-free packing, token-budget planning for packed micro-batches, and the fused log-probs:
each checked by hand or against the padded path it replaces (one rank, in-process)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from polyrl.batch import Batch
from polyrl.errors import ConfigError
from polyrl_engine_fsdp import fused_logprob
from polyrl_engine_fsdp.config import resolve_settings
from polyrl_engine_fsdp.fused_logprob import linear_log_prob
from polyrl_engine_fsdp.microbatch import packed_budget_partition, plan_micro_batches
from polyrl_engine_fsdp.packing import pack_rows, unpack
from polyrl_engine_fsdp.testing import (
    composed_context,
    ragged_batch,
    record_stepped_gradients,
    tiny_model,
)

torch.set_num_threads(1)


def test_pack_rows_by_hand() -> None:
    # prompt width 3, response width 2; real tokens: row 0 = [1 2 | 3], row 1 = [4 | 5 6]
    ids = torch.tensor([[1, 2, 0, 3, 0], [0, 0, 4, 5, 6]])
    # row 0's prompt is left-padded in a real batch; here it sits at columns 0-1 with column 2 as
    # padding, which the packed layout must skip just the same.
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 1, 1, 1]])
    packed = pack_rows(ids, mask, response_width=2)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert packed.cu_seqlens.tolist() == [0, 3, 6] and packed.max_seqlen == 3
    # token 3 is predicted from packed position 1 (token 2); 5 from 3 (token 4); 6 from 4
    assert packed.score_index.tolist() == [1, 3, 4]
    assert packed.labels.tolist() == [3, 5, 6]
    assert unpack(torch.tensor([0.5, 1.5, 2.5]), packed).tolist() == [[0.5, 0.0], [1.5, 2.5]]


def test_packed_budget_partition_first_fit_decreasing() -> None:
    # rows by length 8 (row 2), 7 (row 4), 5 (row 0), 3 (row 1), 2 (row 3) into groups of <= 10:
    # 8 -> A; 7 -> B; 5 -> C; 3 -> B (7+3); 2 -> A (8+2)
    assert packed_budget_partition([5, 3, 8, 2, 7], 10, "k") == [[2, 3], [1, 4], [0]]
    assert packed_budget_partition([4, 4, 4], 12, "k") == [[0, 1, 2]]
    with pytest.raises(ConfigError, match="k=6"):
        packed_budget_partition([5, 7], 6, "k")


def test_plan_counts_real_tokens_when_packed() -> None:
    # real lengths (prompt + response): 5+4, 2+6, 4+1, 1+3 = 9, 8, 5, 4 in rows 11 wide
    batch = ragged_batch([5, 2, 4, 1], [4, 6, 1, 3], 5, 6, torch.Generator().manual_seed(0))
    settings = resolve_settings(
        {}, {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 13}, total_training_steps=1
    )
    # packed: 9 -> A, 8 -> B, 5 -> B (13), 4 -> A (13)
    assert plan_micro_batches(batch, settings, training=True, packed=True) == [[0, 3], [1, 2]]
    # padded, each group costs rows x (longest prompt + longest response): one row per group
    assert len(plan_micro_batches(batch, settings, training=True)) == 4


def _reference(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    log_p = torch.log_softmax((hidden @ weight.t()) / temperature, dim=-1)
    return log_p.gather(-1, labels[:, None])[:, 0], -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("with_entropy", [True, False])
def test_fused_log_prob_and_grads_match_log_softmax(
    with_entropy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fused_logprob, "_CHUNK_ELEMENTS", 3 * 50)  # chunks of 3 tokens
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (10,), generator=gen)
    g_lp, g_ent = torch.randn(10, generator=gen), torch.randn(10, generator=gen)

    log_prob, entropy = linear_log_prob(hidden, weight, labels, 0.7, with_entropy)
    ref_lp, ref_ent = _reference(hidden, weight, labels, 0.7)
    torch.testing.assert_close(log_prob, ref_lp.float())
    loss = (log_prob * g_lp).sum()
    ref_loss = (ref_lp * g_lp).sum()
    if with_entropy:
        assert entropy is not None
        torch.testing.assert_close(entropy, ref_ent.float())
        loss, ref_loss = loss + (entropy * g_ent).sum(), ref_loss + (ref_ent * g_ent).sum()
    grads = torch.autograd.grad(loss, (hidden, weight))
    ref_grads = torch.autograd.grad(ref_loss, (hidden, weight))
    for got, want in zip(grads, ref_grads):  # float32 statistics against a float64 reference
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


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
