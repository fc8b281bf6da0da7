"""Where an FSDP2 actor update spends its time: one ``train_step`` under ``torch.profiler``.

Why: the update's MFU grows with the micro-batch token budget far more than the matmul sizes
explain (issue 10: 16.9 % at 16k tokens, 29.4 % at 40k on the Qwen2-0.5B shape), which points at
a fixed cost per micro-batch. This script finds it: it builds the engine as ``bench_lora.py``
does (random weights of a real shape, one rank), runs warm-up steps (the fused log-probs compile
on the first), times a few plain steps, then profiles one and prints

- per phase (each micro-batch's forward and backward, the optimizer step, marked with
  ``record_function``): wall time on the host and the GPU's busy time inside it;
- the GPU's largest idle gaps with the host operations that were running during each one;
- the top kernels by GPU time and the top host operations by self time.

The Chrome trace (gzip) goes to ``--out`` for a closer look (chrome://tracing, Perfetto).

    python benchmarks/gpu/profile_update.py --device cuda --shape qwen2-0.5b --max-tokens 16384
    # the whole path on a CPU, in seconds (no GPU figures):
    python benchmarks/gpu/profile_update.py --device cpu --shape tiny --rows 8 --prompt-len 8 \
        --response-len 8 --max-tokens 64 --warmup 1 --steps 1
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: bench_fsdp_step
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/gpu/: bench_lora

from bench_fsdp_step import make_batch, token_mean_nll
from bench_lora import engine_context

from polyrl.models.shapes import SHAPES, build_random_model

PHASES = ("polyrl/micro_forward", "polyrl/micro_backward", "polyrl/optimizer_step")
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def _mark_phases(engine: Any) -> None:
    """Wrap the engine's micro-batch loss, backward and optimizer step in profiler ranges."""
    from torch.profiler import record_function

    import polyrl_engine_fsdp.engine as engine_module

    accumulate = engine_module.accumulate

    def marked_accumulate(*args: Any) -> dict[str, float]:
        mini_batch, groups, device, micro_loss, backward = args

        def loss(micro: Any) -> Any:
            with record_function(PHASES[0]):
                return micro_loss(micro)

        def run_backward(value: torch.Tensor) -> None:
            with record_function(PHASES[1]):
                backward(value)

        return accumulate(mini_batch, groups, device, loss, run_backward)

    engine_module.accumulate = marked_accumulate
    step = engine._optimizer_step

    def marked_step() -> tuple[float, float]:
        with record_function(PHASES[2]):
            return step()

    engine._optimizer_step = marked_step


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _busy_within(busy: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in busy)


def analyse_trace(events: list[dict[str, Any]], gaps: int = 15) -> str:
    """A text report of a Chrome trace's events (see the module docstring)."""
    timed = [e for e in events if e.get("ph") == "X" and "dur" in e]
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in timed if e.get("cat") in GPU_CATEGORIES]
    host = [e for e in timed if e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
    lines = []
    marks = [e for e in timed if e.get("cat") == "user_annotation" and e["name"] in PHASES]
    if not marks:
        return "no phase marks in the trace"
    start = min(e["ts"] for e in marks)
    end = max(e["ts"] + e["dur"] for e in marks)
    busy = _union(gpu)
    wall = end - start
    used = _busy_within(busy, start, end)
    lines.append(
        f"profiled step: host wall {wall / 1e3:.1f} ms, GPU busy {used / 1e3:.1f} ms "
        f"({100 * used / max(wall, 1e-9):.0f} %)"
    )
    per_phase: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for mark in marks:
        span = (mark["dur"], _busy_within(busy, mark["ts"], mark["ts"] + mark["dur"]))
        per_phase[mark["name"]].append(span)
    lines.append("phase | count | host wall ms (each) | GPU busy ms inside (each)")
    for name in PHASES:
        spans = per_phase.get(name, [])
        walls = " ".join(f"{w / 1e3:.1f}" for w, _ in spans)
        busies = " ".join(f"{b / 1e3:.1f}" for _, b in spans)
        lines.append(f"{name} | {len(spans)} | {walls} | {busies}")
    holes = [(e0, s1) for (_, e0), (s1, _) in itertools.pairwise(busy) if start <= e0 and s1 <= end]
    holes += [(start, busy[0][0])] if busy and busy[0][0] > start else []
    holes.sort(key=lambda gap: gap[0] - gap[1])
    total_idle = sum(b - a for a, b in holes)
    lines.append(f"GPU idle in the step: {total_idle / 1e3:.1f} ms, {len(holes)} gaps; largest:")
    for a, b in holes[:gaps]:
        running = [e for e in host if e["ts"] < b and e["ts"] + e["dur"] > a]
        running.sort(key=lambda e: e["dur"])  # innermost first
        names = ", ".join(dict.fromkeys(e["name"][:60] for e in running[:6]))
        lines.append(f"  {(b - a) / 1e3:7.2f} ms at +{(a - start) / 1e3:8.1f} ms: {names}")
    return "\n".join(lines)


def _profile(rank: int, world: int, args: argparse.Namespace, model_dir: str) -> str:
    from torch.profiler import ProfilerActivity, profile

    from polyrl_engine_fsdp.engine import FSDPEngine

    engine = FSDPEngine(engine_context(args, model_dir, "full", "actor"))
    _mark_phases(engine)
    vocab = engine.hf_config.vocab_size
    batch = make_batch(args.rows, args.prompt_len, args.response_len, vocab, seed=0)
    tokens = float(batch["attention_mask"].sum())
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    times = []
    for step in range(args.warmup + args.steps):
        sync()
        began = time.perf_counter()
        engine.train_step(batch, token_mean_nll)
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - began)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as prof:
        engine.train_step(batch, token_mean_nll)
        sync()
    trace = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(trace)
    with open(trace) as handle:
        events = json.load(handle)["traceEvents"]
    name = f"trace_{args.shape}_{args.max_tokens}.json.gz"
    with gzip.open(os.path.join(args.out, name), "wt") as out:
        json.dump(events, out)
    params = sum(p.numel() for p in engine.model.parameters())
    median = statistics.median(times)
    mfu = 6 * params * tokens / median / (args.peak_tflops * 1e12)
    sort_gpu = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
    return "\n\n".join(
        [
            f"{args.shape}, {tokens:.0f} tokens per update, budget {args.max_tokens}: "
            f"unprofiled steps {' '.join(f'{t:.3f}' for t in times)} s, median {median:.3f} s, "
            f"MFU 6*N*tokens/time/peak = {100 * mfu:.1f} % (N={params / 1e6:.0f}M)",
            analyse_trace(events),
            prof.key_averages().table(sort_by=sort_gpu, row_limit=args.rows_shown),
            prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows_shown),
        ]
    )


def main() -> None:
    from polyrl_engine_kit.launch import run_on_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-0.5b")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=20)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=16384, help="0: rows per micro-batch")
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--rows-shown", type=int, default=30)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    args.lora_rank, args.eager = 0, False  # bench_lora's context reads them
    os.makedirs(args.out, exist_ok=True)
    model_dir = os.path.join(tempfile.mkdtemp(prefix="polyrl-profile-"), args.shape)
    build_random_model(
        model_dir, args.shape, tokenizer_from=None, dtype="bfloat16", device=args.device
    )
    backend = "nccl" if args.device == "cuda" else "gloo"
    (report,) = run_on_ranks(_profile, 1, args, model_dir, backend=backend, timeout_s=900)
    print(report, flush=True)
    Path(args.out, f"profile_{args.shape}_{args.max_tokens}.txt").write_text(report)


if __name__ == "__main__":
    main()
