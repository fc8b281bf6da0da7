"""The reference pass alone: seconds, tokens/s and forward MFU of the FSDP engine's frozen
reference (``role="ref"``) scoring one step's batch (issue 25, item 4).

``polyrl train`` times the reference stage with Ray, the batch's transfer and the other roles
around it; this times ``compute_log_prob`` of the reference engine in one process, so two
engine versions (``--source``: an export of an older commit's ``plugins/engine_fsdp/src`` and
``plugins/engine_kit/src`` put first on the path) or two micro-batch budgets compare on the
same machine. Each budget runs in its own process (``run_on_ranks``), on a random-weight model
of the shape, with the GPU benchmark's settings (bf16 compute, fp32 master weights in the
actor's engine, packed rows, fused log-probs, compiled layers).
Forward MFU = 2 x parameters x tokens / seconds / 989 TFLOP/s (attention not counted).

    # on the GPU machine, from the repository root, after `. .device/setup.sh`:
    python3 benchmarks/gpu/bench_ref.py --shape qwen2-0.5b --rows 512 --response-len 512 \
        --max-tokens 16384 65536 --label current \
        [--source .baseline/plugins/engine_fsdp/src .baseline/plugins/engine_kit/src]
    # end to end on a CPU, in seconds:
    python3 benchmarks/gpu/bench_ref.py --device cpu --shape tiny --rows 4 --prompt-len 8 \
        --response-len 8 --max-tokens 64 --runs 1 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: bench_fsdp_step

from bench_fsdp_step import make_batch

from polyrl.models.shapes import SHAPES, build_random_model

PEAK_TFLOPS = 989.0  # dense bf16, H100/H200 SXM (the MFU convention of report.py)


def _context(args: argparse.Namespace, model_dir: str, max_tokens: int) -> Any:
    from polyrl_engine_kit.testing import composed_context

    return composed_context(
        model_dir,
        model={"dtype": "bfloat16"},
        actor={
            "use_dynamic_bsz": True,
            "ppo_max_token_len_per_gpu": max_tokens,
            "log_prob_max_token_len_per_gpu": max_tokens,
            "fsdp_config": {"mixed_precision": True},
            "use_torch_compile": args.device == "cuda",
        },
        device=args.device,
        role="ref",
    )


def _measure(rank: int, world: int, args: argparse.Namespace, model_dir: str, tokens: int) -> dict:
    from polyrl_engine_fsdp.engine import FSDPEngine

    cuda = args.device == "cuda"
    ref = FSDPEngine(_context(args, model_dir, tokens))
    built_gib = torch.cuda.memory_allocated() / 2**30 if cuda else 0.0
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    vocab = ref.hf_config.vocab_size
    times = []
    for i in range(args.warmup + args.runs):
        batch = make_batch(args.rows, args.prompt_len, args.response_len, vocab, seed=i)
        sync()
        start = time.perf_counter()
        ref.compute_log_prob(batch)
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    return {
        "seconds": statistics.median(times),
        "runs": times,
        "tokens": float(batch["attention_mask"].sum()),
        "parameters": sum(p.numel() for p in ref.model.parameters()),
        "param_dtypes": sorted({str(p.dtype) for p in ref.model.parameters()}),
        "weights_gib": built_gib,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-0.5b")
    parser.add_argument("--rows", type=int, default=256, help="responses per step")
    parser.add_argument("--prompt-len", type=int, default=20)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[16384])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--source", nargs="*", default=[], help="src folders (engine_fsdp, engine_kit) to import"
    )
    parser.add_argument("--label", default="current")
    parser.add_argument("--cache", default="/tmp/polyrl-ref-bench", help="model folders")
    parser.add_argument("--json", help="append one JSON line per budget")
    args = parser.parse_args()
    if args.source:  # the spawned ranks inherit the environment, so the older engine is theirs
        sources = [str(Path(source).resolve()) for source in args.source]
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [*sources, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        sys.path[:0] = sources
    from polyrl_engine_kit.launch import run_on_ranks

    model_dir = os.path.join(args.cache, args.shape)
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        build_random_model(
            model_dir, args.shape, tokenizer_from=None, dtype="bfloat16", device=args.device
        )
        if args.device == "cuda":
            torch.cuda.empty_cache()  # the measuring process gets the whole GPU
    backend = "nccl" if args.device == "cuda" else "gloo"
    for tokens in args.max_tokens:
        (r,) = run_on_ranks(_measure, 1, args, model_dir, tokens, backend=backend, timeout_s=900)
        flops = 2 * r["parameters"] * r["tokens"]
        mfu = flops / r["seconds"] / (PEAK_TFLOPS * 1e12)
        print(
            f"[{args.label}] {args.shape} ref, {args.rows} rows x ({args.prompt_len} + "
            f"{args.response_len}) = {r['tokens']:,.0f} tokens, {tokens}-token micro-batches, "
            f"weights {r['param_dtypes']} {r['weights_gib']:.1f} GiB, "
            f"peak {r['peak_gib']:.1f} GiB, "
            f"{r['device']}: {r['seconds']:.3f} s (runs {', '.join(f'{t:.3f}' for t in r['runs'])})"
            f" = {r['tokens'] / r['seconds']:,.0f} tokens/s, forward MFU {100 * mfu:.1f} % "
            f"(2 x {r['parameters'] / 1e6:.0f}M x tokens / s / {PEAK_TFLOPS:.0f} TFLOP/s)",
            flush=True,
        )
        if args.json:
            line = {
                "label": args.label,
                "shape": args.shape,
                "rows": args.rows,
                "response_len": args.response_len,
                "max_tokens": tokens,
                "mfu": mfu,
                **r,
            }
            with open(args.json, "a") as fh:
                fh.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
