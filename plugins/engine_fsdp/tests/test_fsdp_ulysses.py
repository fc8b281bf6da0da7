"""Ulysses sequence parallelism: the FSDP engine with ``ulysses_sequence_parallel_size=2`` on 2
ranks (one sequence-parallel group, one data-parallel rank) against the same engine on 1 rank
without it, on the same rows in float32: log-probs, entropy, the loss, the gradients the
optimizer steps on, and the log-probs after that step; the same for a value head (critic).
Also the data-parallel position the engine reports and the config checks.

The CUDA variant (2 GPUs over NCCL, bf16 with the default compiled layers) is
:func:`test_ulysses_matches_unsplit_on_cuda`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from test_fsdp_packing import _policy_loss as policy_loss

from polyrl.api import ModelHead
from polyrl.api.testing import schema_config
from polyrl.batch import Batch
from polyrl_engine_fsdp.checks import check_config
from polyrl_engine_kit.checks import head_problem
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import composed_context, ragged_batch, tiny_model

torch.set_num_threads(1)
SP = "ulysses_sequence_parallel_size"
# Packed micro-batches of odd lengths (padded to a multiple of 2), responses that straddle the
# slice boundary and one that lies in a single slice.
PROMPTS, RESPONSES = [5, 2, 4, 1, 3], [4, 6, 1, 3, 6]


def _batch() -> Batch:
    gen = torch.Generator().manual_seed(0)
    batch = ragged_batch(PROMPTS, RESPONSES, 5, 6, gen)
    batch["advantages"] = torch.randn(len(PROMPTS), 6, generator=gen)
    batch["returns"] = torch.randn(len(PROMPTS), 6, generator=gen)
    return batch


def value_loss(micro: Batch, values: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    mask = micro["response_mask"].float()
    error = ((values - micro["returns"]) ** 2 * mask).sum()
    loss = error / micro.meta["mini_batch_response_tokens"]
    return loss, {"critic/vf_loss": float(loss.detach())}


def _record_full_gradients(engine: Any) -> dict[str, torch.Tensor]:
    """Each ``optimizer.step()`` fills the dict with the whole (gathered) gradient of every
    parameter it steps on (collective: every rank steps)."""
    names = {id(p): n for n, p in engine.model.named_parameters()}
    stepped: dict[str, torch.Tensor] = {}

    def record(opt: torch.optim.Optimizer, *_: Any) -> None:
        for group in opt.param_groups:
            for param in group["params"]:
                grad = param.grad
                full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
                stepped[names[id(param)]] = full.detach().float().cpu().clone()

    engine.optimizer.register_step_pre_hook(record)
    return stepped


def _engines_run(
    path: str,
    rank: int,
    world: int,
    sp: int,
    device: str = "cpu",
    mixed: bool = False,
    rows: list[int] | None = None,
    heads: tuple[ModelHead, ...] = (ModelHead.CAUSAL_LM, ModelHead.VALUE),
) -> dict[str, Any]:
    """Engines of the given Ulysses size and heads on ``rows`` of the batch (all by default):
    scores, one step, scores after."""
    from polyrl_engine_fsdp.engine import FSDPEngine

    batch = _batch() if rows is None else _batch().select_rows(rows)
    out: dict[str, Any] = {}
    for head in heads:
        ctx = composed_context(
            path,
            model={"dtype": "bfloat16" if mixed else "float32"},
            actor={
                SP: sp,
                "ppo_micro_batch_size_per_gpu": 2,
                "log_prob_micro_batch_size_per_gpu": 3,
                # no clipping: a gradient off by a constant factor would be clipped alike
                "optim": {"lr": 1e-2, "clip_grad": 1e9},
                "fsdp_config": {"mixed_precision": mixed},
            },
            device=device,
            rank=rank,
            world_size=world,
            role="critic" if head is ModelHead.VALUE else "actor",
        )
        ctx.head = head
        engine = FSDPEngine(ctx)
        stepped = _record_full_gradients(engine)
        key = head.value
        out[f"{key}/position"] = engine.data_parallel_rank()
        out[f"{key}/paths"] = engine.paths
        if head is ModelHead.CAUSAL_LM:
            out["lp"], out["ent"] = engine.compute_log_prob(
                batch, temperature=0.8, calculate_entropy=True
            )
            out["metrics"] = engine.train_step(batch, policy_loss, temperature=0.8)
            out["lp_after"], _ = engine.compute_log_prob(batch, temperature=0.8)
        else:
            out["values"] = engine.compute_values(batch)
            out["value_metrics"] = engine.train_value_step(batch, value_loss)
            out["values_after"] = engine.compute_values(batch)
        out[f"{key}/grads"] = stepped
        del engine
    return out


def _scenario_split(rank: int, world: int, path: str, device: str, mixed: bool) -> dict:
    out = _engines_run(path, rank, world, sp=world, device=device, mixed=mixed)
    if world > 1:
        out["attention"] = _one_kv_head_attention(rank, world, torch.device(device))
    return out


def _one_kv_head_attention(rank: int, world: int, device: torch.device) -> dict:
    """Ulysses attention with 2 query heads and 1 key/value head (repeated to one per rank)
    against the unsplit packed attention on the whole row: outputs and input gradients."""
    from polyrl_engine_kit.packed_attention import packed_attention_forward
    from polyrl_engine_kit.ulysses import sequence_parallel_group, ulysses_attention_forward

    gen = torch.Generator().manual_seed(5)
    length, width = 10, 10 // world
    whole = [torch.randn(1, heads, length, 8, generator=gen) for heads in (2, 1, 1)]
    weight = torch.randn(1, length, 2, 8, generator=gen)
    bounds = {"cu_seq_lens_q": torch.tensor([0, 3, length], dtype=torch.int32), "max_length_q": 7}
    bounds = {k: v.to(device) if torch.is_tensor(v) else v for k, v in bounds.items()}
    mine = slice(rank * width, (rank + 1) * width)
    full_in = [t.to(device).clone().requires_grad_() for t in whole]
    full, _ = packed_attention_forward(None, *full_in, None, **bounds)
    (full * weight.to(device)).sum().backward()
    part_in = [t[:, :, mine].to(device).clone().requires_grad_() for t in whole]
    sp = sequence_parallel_group(world, device)
    part, _ = ulysses_attention_forward(None, *part_in, None, sequence_parallel=sp, **bounds)
    (part * weight[:, mine].to(device)).sum().backward()
    return {
        "split": [part.detach().cpu(), *(t.grad.cpu() for t in part_in)],
        "whole": [full[:, mine].detach().cpu(), *(t.grad[:, :, mine].cpu() for t in full_in)],
    }


@pytest.fixture(scope="module")
def unsplit() -> dict[str, Any]:
    """One rank, no sequence parallelism, in this process."""
    assert not dist.is_initialized()
    try:
        return _engines_run(tiny_model("ulysses_"), 0, 1, sp=1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _assert_same(split: dict, unsplit: dict, close: dict[str, float]) -> None:
    for key in ("lp", "ent", "lp_after", "values", "values_after"):
        torch.testing.assert_close(split[key], unsplit[key], **close, msg=key)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert split["metrics"][key] == pytest.approx(unsplit["metrics"][key], rel=close["rtol"])
    for key in ("critic/vf_loss", "critic/grad_norm"):
        got, want = split["value_metrics"][key], unsplit["value_metrics"][key]
        assert got == pytest.approx(want, rel=close["rtol"]), key
    for head in ("causal_lm", "value"):
        grads, reference = split[f"{head}/grads"], unsplit[f"{head}/grads"]
        assert grads.keys() == reference.keys() and grads
        for name, grad in grads.items():
            atol = close["atol"] * max(1.0, float(reference[name].abs().max()))
            torch.testing.assert_close(grad, reference[name], atol=atol, rtol=close["rtol"])


def test_ulysses_matches_unsplit_on_cpu(unsplit: dict) -> None:
    results = run_on_ranks(_scenario_split, 2, tiny_model("ulysses_"), "cpu", False, timeout_s=240)
    for rank, split in enumerate(results):
        assert split["causal_lm/paths"].ulysses == 2 and split["causal_lm/paths"].packed
        # one data-parallel rank: both get the same rows, rank 0 returns the output
        for head in ("causal_lm", "value"):
            position = split[f"{head}/position"]
            assert (position.dp_rank, position.dp_size, position.returns_output) == (
                0,
                1,
                rank == 0,
            )
        _assert_same(split, unsplit, {"atol": 2e-5, "rtol": 1e-5})
        attention = split["attention"]
        for got, want in zip(attention["split"], attention["whole"]):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert results[1]["metrics"] == results[0]["metrics"]


# dp rank 0 gets 5 rows (3 micro-batches of 2), dp rank 1 one row: it adds 2 dummy passes, which
# under sequence parallelism run the all-to-alls too
DP_ROWS = ([0, 1, 2, 3, 4], [3])


HEADS_POLICY = (ModelHead.CAUSAL_LM,)


def _scenario_dp(rank: int, world: int, path: str, sp: int) -> dict:
    return _engines_run(path, rank, world, sp=sp, rows=DP_ROWS[rank // sp], heads=HEADS_POLICY)


def _one_rank(rows: list[int]) -> dict[str, Any]:
    """The policy engine on one rank without sequence parallelism, in this process."""
    assert not dist.is_initialized()
    try:
        return _engines_run(tiny_model("ulysses_"), 0, 1, sp=1, rows=rows, heads=HEADS_POLICY)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.slow
def test_ulysses_groups_are_data_parallel_ranks() -> None:
    """4 ranks as 2 data-parallel ranks x Ulysses 2 against each data-parallel rank's rows on
    one rank without it: the same scores and loss per data-parallel rank, and the step's
    gradients the mean of the two (FSDP averages over data-parallel ranks)."""
    split = run_on_ranks(_scenario_dp, 4, tiny_model("ulysses_"), 2, timeout_s=400)
    alone = [_one_rank(rows) for rows in DP_ROWS]
    for rank, result in enumerate(split):
        position = result["causal_lm/position"]
        assert (position.dp_rank, position.dp_size, position.returns_output) == (
            rank // 2,
            2,
            rank % 2 == 0,
        )
        want = alone[rank // 2]
        for key in ("lp", "ent"):
            torch.testing.assert_close(result[key], want[key], atol=2e-5, rtol=1e-5, msg=key)
        for key in ("actor/pg_loss", "actor/entropy"):
            assert result["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-5), key
        for name, grad in result["causal_lm/grads"].items():
            expected = (alone[0]["causal_lm/grads"][name] + alone[1]["causal_lm/grads"][name]) / 2
            atol = 2e-5 * max(1.0, float(expected.abs().max()))
            torch.testing.assert_close(grad, expected, atol=atol, rtol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL)")
def test_ulysses_matches_unsplit_on_cuda() -> None:
    """2 GPUs: float32 eager against float32 eager (tight), then bf16 with the defaults
    (compiled layers, varlen flash attention, fused log-probs) against bf16 unsplit."""
    path = tiny_model("ulysses_cuda_")
    for mixed, close in (
        (False, {"atol": 1e-4, "rtol": 1e-4}),
        (True, {"atol": 0.05, "rtol": 0.02}),
    ):
        (reference,) = run_on_ranks(
            _scenario_split, 1, path, "cuda", mixed, backend="nccl", timeout_s=400
        )
        split = run_on_ranks(_scenario_split, 2, path, "cuda", mixed, backend="nccl", timeout_s=400)
        for result in split:
            _assert_same(result, reference, close)


# ---- config checks (no process group) ---------------------------------------------------------
def _check(*overrides: str) -> list[str]:
    cfg = OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(list(overrides)))
    return check_config(cfg)


def test_config_checks_ulysses() -> None:
    actor = f"actor_rollout_ref.actor.{SP}"
    two = "trainer.n_gpus_per_node=2"
    assert _check(f"{actor}=2", two) == []
    (line,) = _check(f"{actor}=3", two)
    assert line.startswith(f"{actor}=3 does not divide the world size 2")
    (line,) = _check(f"{actor}=2", two, "actor_rollout_ref.model.use_remove_padding=false")
    assert (
        line == f"{actor}=2 splits packed rows: set actor_rollout_ref.model.use_remove_padding=true"
    )
    (line,) = _check(f"{actor}=2", two, "critic.strategy=fsdp2", f"critic.{SP}=1")
    assert line.startswith(f"critic.{SP}=1 differs from the actor's 2")
    # 14 heads, 2 key/value heads (Qwen2-0.5B): 2 splits both; 4 does not divide the heads
    assert head_problem(14, 2, 2, "x") is None and head_problem(14, 2, 4, "x")
    # 16 heads, 2 key/value heads (Qwen2.5-3B): 4 and 8 repeat the key/value heads; 3 does not
    assert head_problem(16, 2, 8, "x") is None and head_problem(12, 2, 3, "x")
    path = tiny_model("ulysses_")  # 2 attention heads, 2 key/value heads
    (line,) = _check(
        f"{actor}=4", "trainer.n_gpus_per_node=4", f"actor_rollout_ref.model.path={path}"
    )
    assert line == (
        f"{actor}=4 must divide the model's 2 attention heads, and divide or be a multiple of "
        f"its 2 key/value heads (each rank attends with a share of both); use such a size"
    )


def test_other_engines_refuse_ulysses() -> None:
    from polyrl_engine_kit.checks import actor_ref_problems

    cfg = OmegaConf.merge(
        schema_config(), OmegaConf.from_dotlist([f"actor_rollout_ref.actor.{SP}=2"])
    )
    arr = cfg.actor_rollout_ref
    arr.actor.strategy = "deepspeed"
    problems = actor_ref_problems(arr.actor, arr.ref)
    assert (
        f"{SP}=2: Ulysses sequence parallelism is implemented by the FSDP engine only"
        in (problems[0])
    )
    assert actor_ref_problems(arr.actor, arr.ref, sequence_parallel=True) == []
