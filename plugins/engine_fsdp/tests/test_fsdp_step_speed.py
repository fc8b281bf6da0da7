"""The step's host-side speed paths change no number: layers kept gathered within a step
(``fsdp_config.accumulate_unsharded``) and compiled decoder layers (``use_torch_compile``).

Both were added because a profiled H200 update was host-bound (benchmarks/gpu/profile_update.py);
here each is checked against the plain path on two gloo ranks / one rank on CPU, and for what
makes it faster: one reduce-scatter per unit and step instead of one per micro-batch, and one
compiled graph shared by every layer and every micro-batch length.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torch.distributed as dist

from polyrl.errors import ConfigError
from polyrl_engine_kit.config import resolve_settings
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import (
    composed_context,
    ragged_batch,
    record_stepped_gradients,
    tiny_model,
)

torch.set_num_threads(1)


def _loss(micro: Any, log_prob: torch.Tensor, entropy: Any) -> tuple[torch.Tensor, dict]:
    mask = micro["response_mask"].to(log_prob.dtype)
    loss = -(log_prob * micro["advantages"] * mask).sum() / micro.meta["mini_batch_response_tokens"]
    return loss, {"actor/pg_loss": float(loss.detach())}


def _batch(seed: int, rows: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, 6, (rows,), generator=gen).tolist()
    responses = torch.randint(1, 7, (rows,), generator=gen).tolist()
    batch = ragged_batch(prompts, responses, 5, 6, gen)
    batch["advantages"] = torch.randn(rows, 6, generator=gen)
    return batch


def _engine(
    model_dir: str,
    accumulate_unsharded: bool,
    rank: int = 0,
    world: int = 1,
    checkpointed: bool = False,
    packed: bool = True,
) -> Any:
    from polyrl_engine_fsdp.engine import FSDPEngine

    ctx = composed_context(
        model_dir,
        model={
            "dtype": "float32",
            "enable_gradient_checkpointing": checkpointed,
            "use_remove_padding": packed,
        },
        actor={
            "ppo_micro_batch_size_per_gpu": 2,  # 3 micro-batches of this rank's 6 rows
            "optim": {"lr": 1e-2},
            "fsdp_config": {"mixed_precision": False, "accumulate_unsharded": accumulate_unsharded},
        },
        rank=rank,
        world_size=world,
    )
    return FSDPEngine(ctx)


# FSDP2's collectives by kind, under each name some torch release calls them by
COLLECTIVES = {
    "gather": ("all_gather_single", "all_gather_into_tensor"),
    "reduce": ("reduce_scatter_single", "reduce_scatter_tensor"),
}


def _gathered_step(rank: int, world: int, model_dir: str, gathered: bool) -> dict[str, Any]:
    calls: Counter[str] = Counter()
    originals = {
        (kind, name): getattr(dist, name)
        for kind, names in COLLECTIVES.items()
        for name in names
        if hasattr(dist, name)
    }

    def counting(kind: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[kind] += 1
            return original(*args, **kwargs)

        return call

    engine = _engine(model_dir, gathered, rank, world)
    assert engine.gathered_steps is gathered
    stepped = record_stepped_gradients(engine.model, engine.optimizer)
    batch = _batch(seed=rank, rows=6)
    for (kind, name), original in originals.items():
        setattr(dist, name, counting(kind, original))
    try:
        log_prob, _ = engine.compute_log_prob(batch)
        metrics = engine.train_step(batch, _loss)
    finally:
        for (_, name), original in originals.items():
            setattr(dist, name, original)
    units = sum(1 for m in engine.model.modules() if type(m).__name__.startswith("FSDP"))
    return {"lp": log_prob, "m": metrics, "g": stepped, "calls": dict(calls), "units": units}


def _gathered_and_plain(rank: int, world: int, model_dir: str) -> dict[bool, dict[str, Any]]:
    return {flag: _gathered_step(rank, world, model_dir, flag) for flag in (False, True)}


@pytest.fixture(scope="module")
def gathered_runs() -> dict[bool, list[dict[str, Any]]]:
    """Per flag, each rank's results (both engines in the same two rank processes)."""
    ranks = run_on_ranks(_gathered_and_plain, 2, tiny_model("gathered_"), timeout_s=240)
    return {flag: [result[flag] for result in ranks] for flag in (False, True)}


def test_gathered_step_gives_the_same_step(gathered_runs: dict) -> None:
    plain, gathered = gathered_runs[False], gathered_runs[True]
    for rank in range(2):
        torch.testing.assert_close(gathered[rank]["lp"], plain[rank]["lp"], atol=0, rtol=0)
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert gathered[rank]["m"][key] == pytest.approx(plain[rank]["m"][key], rel=1e-6)
        assert gathered[rank]["g"].keys() == plain[rank]["g"].keys()
        for name, grad in gathered[rank]["g"].items():
            # summed unsharded then reduced, instead of reduced then summed: the same gradients
            # to fp32 rounding (measured: within 1.5e-7 of the largest)
            reference = plain[rank]["g"][name]
            scale = float(reference.abs().max())
            torch.testing.assert_close(grad, reference, atol=1e-5 * scale, rtol=1e-5)


def test_gathered_step_communicates_once_per_unit(gathered_runs: dict) -> None:
    plain, gathered = gathered_runs[False][0], gathered_runs[True][0]
    units = plain["units"]  # the decoder layers and the root
    assert units == 3
    # default: per micro-batch (3 in training, 3 without grad) every unit gathers in forward
    # and again in backward (reshard after forward), and reduces in backward
    assert plain["calls"]["reduce"] == 3 * units
    # gathered: one reduce per unit after the last micro-batch, one gather per unit and pass
    assert gathered["calls"]["reduce"] == units
    assert gathered["calls"]["gather"] == 2 * units
    assert plain["calls"]["gather"] > 3 * gathered["calls"]["gather"]


def _compiled_engine_run(
    model_dir: str,
    compiled: bool,
    checkpointed: bool = False,
    packed: bool = True,
    steps: int = 3,
) -> dict[str, Any]:
    """``steps`` steps of an engine whose decoder layers are compiled (or not). Checkpointed: the
    padded attention (the CPU's packed one splits sequences on the host, a graph break, and a
    checkpointed layer must trace whole) and AOTAutograd, whose saved activations differ from
    the eager forward's: what broke the backward on CUDA when the checkpoint wrapped the
    compiled layer."""
    from torch._dynamo.backends.debugging import aot_eager

    from polyrl_engine_kit import compiling, fast_paths

    compiling.EAGER_NO_GRAD_TOKENS = 0  # the tiny batches' no-grad forwards compiled too

    graphs: list[int] = []
    checkpoints: list[str] = []

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(len(graph.graph.nodes))
        checkpoints.extend(
            str(n.target) for n in graph.graph.nodes if "checkpoint" in str(n.target)
        )
        if checkpointed:
            return aot_eager(graph, example_inputs)
        return graph.forward  # dynamo's capture and guards, the captured ops run as they are

    eager_layers = fast_paths.layer_compile_backend
    if compiled:  # CUDA gets Inductor (tested on CUDA); here dynamo's graphs without codegen
        fast_paths.layer_compile_backend = lambda device, settings, lora: counting_backend
    try:
        engine = _engine(model_dir, False, checkpointed=checkpointed, packed=packed)
    finally:
        fast_paths.layer_compile_backend = eager_layers
    assert engine.paths.compiled is compiled
    results: dict[str, Any] = {"graphs_after": [], "checkpoints": checkpoints}
    for step, rows in enumerate((6, 5, 4)[:steps]):  # micro-batches of other lengths each step
        batch = _batch(seed=10 + step, rows=rows)
        lp, _ = engine.compute_log_prob(batch)
        metrics = engine.train_step(batch, _loss)
        results[step] = {"lp": lp, "m": metrics}
        results["graphs_after"].append(len(graphs))
    results["w"] = {n: w.detach().clone() for n, w in engine.named_weights()}
    return results


def _eager_compiled_checkpointed(rank: int, world: int, model_dir: str) -> list[dict[str, Any]]:
    return [
        _compiled_engine_run(model_dir, compiled=False),
        _compiled_engine_run(model_dir, compiled=True),
        # one step: what the checkpoint changes is the first compile's graph
        _compiled_engine_run(model_dir, compiled=False, packed=False, steps=1),
        _compiled_engine_run(model_dir, compiled=True, checkpointed=True, packed=False, steps=1),
    ]


@pytest.fixture(scope="module")
def compiled_runs() -> list[dict[str, Any]]:
    model_dir = tiny_model("compiled_")
    ((runs),) = run_on_ranks(_eager_compiled_checkpointed, 1, model_dir, timeout_s=240)
    return runs


def _assert_same_steps(run: dict[str, Any], eager: dict[str, Any]) -> None:
    for step in range(len(run["graphs_after"])):
        torch.testing.assert_close(run[step]["lp"], eager[step]["lp"], atol=1e-5, rtol=1e-5)
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert run[step]["m"][key] == pytest.approx(eager[step]["m"][key], rel=1e-5)
    for name, weight in run["w"].items():
        torch.testing.assert_close(weight, eager["w"][name], atol=1e-4, rtol=0)


def test_compiled_layers_match_eager_and_compile_once(compiled_runs: list) -> None:
    eager, compiled, _, _ = compiled_runs
    _assert_same_steps(compiled, eager)
    assert compiled["checkpoints"] == []
    first, second, third = compiled["graphs_after"]
    # The first step compiles (with and without grad; the CPU attention's per-sequence split
    # cuts each layer into a few graphs) once for both layers; the second adds the graphs of a
    # micro-batch holding a single sequence (a size of 1 is specialised); the third, whose
    # micro-batches pack yet other numbers of tokens, compiles nothing.
    assert 0 < first <= 24 and second - first <= 4
    assert third == second


def test_compiled_layers_recompute_inside_their_graph(compiled_runs: list) -> None:
    """Gradient checkpointing with compiled layers: the checkpoint is traced into each layer's
    graph (Hugging Face's, around the compiled call, broke the backward on CUDA), and the
    steps are the eager steps'."""
    _, _, eager, checkpointed = compiled_runs
    _assert_same_steps(checkpointed, eager)
    assert checkpointed["graphs_after"][0] > 0, "the checkpointed layers fell back to eager"
    assert checkpointed["checkpoints"], "no activation checkpoint in the compiled layer graphs"


@pytest.mark.parametrize(
    ("fsdp", "message"),
    [
        ({"accumulate_unsharded": "yes"}, "accumulate_unsharded='yes' is not one of auto, true"),
        (
            {"accumulate_unsharded": True, "param_offload": True, "optimizer_offload": True},
            "accumulate_unsharded=true keeps full weights and gradients on the GPU",
        ),
    ],
)
def test_accumulate_unsharded_values_are_checked(fsdp: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_settings({}, {"fsdp_config": fsdp}, total_training_steps=1)
    auto = resolve_settings({}, {"fsdp_config": {**fsdp, "accumulate_unsharded": "auto"}}, 1)
    assert auto.accumulate_unsharded is None
