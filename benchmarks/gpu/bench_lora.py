"""Full fine-tuning vs LoRA on one GPU: peak memory and step time of the FSDP2 engine, and the
largest Qwen2 shape each way trains (issue 14, item 6).

Per shape (smallest first) and mode, one process builds :class:`FSDPEngine` on a random-weight
model of that shape (``polyrl.models.shapes``; folders cached under ``--cache``) and times, on
the GPU benchmark's update batch (``run_h200.sh``: 256 responses of 256 tokens after ~20-token
prompts, a 16384-token budget per micro-batch), what an RL step asks of the actor:

- ``ref``: the reference log-probs (full: a second, frozen engine is what a run loads for them,
  counted in ``ref_model_gib``; LoRA: the same engine with its adapters disabled, no copy);
- ``update``: one optimizer step (``train_step``) over the batch;
- memory: after building (weights, and the frozen reference for full fine-tuning), and the peak
  over the steps (``torch.cuda.max_memory_allocated``).

A mode stops at its first shape that runs out of memory; the last shape that ran is the largest
that fits. Results go to stdout as a Markdown table and to ``--out`` as JSON.

    # on the GPU machine, from the repository root:
    python benchmarks/gpu/bench_lora.py --device cuda
    # end to end on a CPU, in seconds:
    python benchmarks/gpu/bench_lora.py --device cpu --shapes tiny --rows 4 --prompt-len 8 \
        --response-len 8 --max-tokens 0 --steps 1 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: bench_fsdp_step

from bench_fsdp_step import make_batch, token_mean_nll

from polyrl.models.shapes import SHAPES, build_random_model

MODES = ("full", "lora")
DEFAULT_SHAPES = ("qwen2-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b")


def engine_context(args: argparse.Namespace, model_dir: str, mode: str, role: str) -> Any:
    from polyrl_engine_kit.testing import composed_context

    lora = {"lora_rank": args.lora_rank, "lora_alpha": 2 * args.lora_rank} if mode == "lora" else {}
    return composed_context(
        model_dir,
        model={
            "dtype": "bfloat16",
            "enable_gradient_checkpointing": args.grad_ckpt,
            **lora,
        },
        actor={
            "ppo_micro_batch_size_per_gpu": args.rows,
            "use_dynamic_bsz": args.max_tokens > 0,
            "ppo_max_token_len_per_gpu": max(args.max_tokens, 1),
            "log_prob_micro_batch_size_per_gpu": args.rows,
            "log_prob_max_token_len_per_gpu": max(args.max_tokens, 1),
            "optim": {"lr": 1e-5},
            "fsdp_config": {"mixed_precision": True},
            "use_torch_compile": not args.eager,
        },
        device=args.device,
        role=role,
        total_training_steps=args.steps + args.warmup,
    )


def _gib() -> float:
    return torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def _measure(rank: int, world: int, args: argparse.Namespace, model_dir: str, mode: str) -> dict:
    """One mode on one shape (runs in its own process: an OOM ends only that process)."""
    from polyrl_engine_fsdp.engine import FSDPEngine

    engine = FSDPEngine(engine_context(args, model_dir, mode, "actor"))
    policy_gib = _gib()
    ref = engine if mode == "lora" else FSDPEngine(engine_context(args, model_dir, mode, "ref"))
    built_gib = _gib()
    vocab = engine.hf_config.vocab_size
    batches = [
        make_batch(args.rows, args.prompt_len, args.response_len, vocab, seed=s)
        for s in range(args.steps + args.warmup)
    ]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    ref_times, update_times = [], []
    for i, batch in enumerate(batches):
        sync()
        start = time.perf_counter()
        with ref.adapters_disabled() if mode == "lora" else nullcontext():
            ref.compute_log_prob(batch)
        sync()
        middle = time.perf_counter()
        engine.train_step(batch, token_mean_nll)
        sync()
        if i >= args.warmup:
            ref_times.append(middle - start)
            update_times.append(time.perf_counter() - middle)
    trainable = sum(p.numel() for p in engine.model.parameters() if p.requires_grad)
    return {
        "policy_gib": policy_gib,
        "ref_model_gib": built_gib - policy_gib,
        "after_steps_gib": _gib(),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else 0.0,
        "ref_s": statistics.median(ref_times),
        "update_s": statistics.median(update_times),
        "tokens": float(batches[-1]["attention_mask"].sum()),
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "trainable": trainable,
    }


def _run(args: argparse.Namespace, model_dir: str, mode: str) -> dict:
    """``_measure`` in a fresh process; ``{"oom": True}`` when it ran out of memory."""
    from polyrl_engine_kit.launch import run_on_ranks

    backend = "nccl" if args.device == "cuda" else "gloo"
    try:
        (result,) = run_on_ranks(
            _measure, 1, args, model_dir, mode, backend=backend, timeout_s=args.timeout
        )
    except Exception as exc:  # an OOM is a result; anything else is re-raised
        if "out of memory" not in str(exc).lower():
            raise
        return {"oom": True}
    return result


def _row(shape: str, mode: str, r: dict) -> str:
    if r.get("oom"):
        return f"| {shape} | {mode} | out of memory | | | | | | |"
    return (
        f"| {shape} | {mode} | {r['parameters'] / 1e9:.2f}B | {r['trainable'] / 1e6:.1f}M | "
        f"{r['policy_gib'] + r['ref_model_gib']:.1f} | {r['peak_gib']:.1f} | {r['ref_s']:.3f} | "
        f"{r['update_s']:.3f} | {r['tokens'] / r['update_s']:,.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=DEFAULT_SHAPES)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    parser.add_argument("--rows", type=int, default=256, help="responses per update")
    parser.add_argument("--prompt-len", type=int, default=20)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=16384, help="0: rows per micro-batch")
    parser.add_argument("--lora-rank", type=int, default=32, help="alpha is twice the rank")
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument(
        "--eager", action="store_true", help="use_torch_compile=false (no compile time per shape)"
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement")
    parser.add_argument("--cache", default="/tmp/polyrl-lora-bench", help="model folders")
    parser.add_argument("--keep-models", action="store_true", help="leave the folders on disk")
    parser.add_argument("--out", default="bench_lora.json")
    args = parser.parse_args()

    results: dict[str, dict[str, dict]] = {}
    fits: dict[str, str | None] = dict.fromkeys(args.modes)
    active = list(args.modes)
    print("| shape | mode | params | trainable | weights GiB (policy+ref) | peak GiB | ref s | "
          "update s | update tokens/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        if not active:
            break
        model_dir = os.path.join(args.cache, shape)
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            build_random_model(
                model_dir, shape, tokenizer_from=None, dtype="bfloat16", device=args.device
            )
            if args.device == "cuda":
                torch.cuda.empty_cache()  # the measuring process gets the whole GPU
        for mode in list(active):
            result = results.setdefault(shape, {})[mode] = _run(args, model_dir, mode)
            if result.get("oom"):
                active.remove(mode)
            else:
                fits[mode] = shape
            print(_row(shape, mode, result), flush=True)
            report = {"args": vars(args), "results": results, "largest": fits}
            Path(args.out).write_text(json.dumps(report, indent=1))  # kept if a later shape hangs
        if not args.keep_models:
            shutil.rmtree(model_dir, ignore_errors=True)
    largest = ", ".join(f"{mode} {shape}" for mode, shape in fits.items())
    print(f"largest shape that trains on one device: {largest}")


if __name__ == "__main__":
    main()
