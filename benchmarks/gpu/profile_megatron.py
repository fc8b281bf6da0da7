"""Where the Megatron engine's scoring and update spend their time, packed rows against padded
rows, on one GPU.

Why: the engine's two layouts (``actor_rollout_ref.model.use_remove_padding``) run different
attention and log-prob code; this times ``compute_log_prob`` and ``train_step`` of each on the
same batch (random weights of a real shape, one rank; medians of ``--steps`` after
``--warmup``), then profiles one ``compute_log_prob`` and one ``train_step`` of each layout and
prints the top host operations by self time and the top kernels by GPU time.

    python benchmarks/gpu/profile_megatron.py --shape qwen2-0.5b --max-tokens 16384
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: bench_fsdp_step

from bench_fsdp_step import make_batch, token_mean_nll

from polyrl.models.shapes import SHAPES, build_random_model


def _context(args: argparse.Namespace, model_dir: str, packed: bool) -> Any:
    from polyrl_engine_kit.testing import composed_context

    return composed_context(
        model_dir,
        model={"dtype": "bfloat16", "use_remove_padding": packed},
        actor={
            "strategy": "megatron",
            "ppo_micro_batch_size_per_gpu": args.rows,
            "use_dynamic_bsz": True,
            "ppo_max_token_len_per_gpu": args.max_tokens,
            "log_prob_micro_batch_size_per_gpu": args.rows,
            "log_prob_max_token_len_per_gpu": args.max_tokens,
            "optim": {"lr": 1e-6},
            "use_torch_compile": True,
        },
        device="cuda",
        total_training_steps=args.steps + args.warmup + 1,
    )


def _timed(fn: Any) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _profile_table(fn: Any, rows: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    by_host = events.table(sort_by="self_cpu_time_total", row_limit=rows)
    by_gpu = events.table(sort_by="self_cuda_time_total", row_limit=rows)
    return f"-- host, by self time\n{by_host}\n-- GPU, by kernel time\n{by_gpu}"


def _measure(engine: Any, batch: Any, args: argparse.Namespace, layout: str) -> list[str]:
    score = partial(engine.compute_log_prob, batch)
    update = partial(engine.train_step, batch, token_mean_nll)
    for _ in range(args.warmup):
        score()
        update()
    scored = statistics.median(_timed(score) for _ in range(args.steps))
    updated = statistics.median(_timed(update) for _ in range(args.steps))
    lines = [
        f"{layout}: compute_log_prob {scored:.3f} s, train_step {updated:.3f} s "
        f"(peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB)"
    ]
    if args.profile:
        lines.append(f"== {layout} compute_log_prob\n{_profile_table(score, args.rows_shown)}")
        lines.append(f"== {layout} train_step\n{_profile_table(update, args.rows_shown)}")
    return lines


def _rank(rank: int, world: int, args: argparse.Namespace, model_dir: str) -> None:
    """Prints each layout's figures as they come (a slow layout cannot hide the other's)."""
    from polyrl_engine_megatron.engine import MegatronEngine

    vocab = SHAPES[args.shape]["vocab_size"]
    batch = make_batch(args.rows, args.prompt_len, args.response_len, vocab, seed=0)
    tokens = int(batch["attention_mask"].sum())
    print(f"{args.shape}, {args.rows} rows, {tokens} tokens, {args.max_tokens}-token budget")
    for layout in args.layouts:
        engine = MegatronEngine(_context(args, model_dir, layout == "packed"))
        print("\n".join(_measure(engine, batch, args, layout)), flush=True)
        del engine
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-0.5b")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=20)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--layouts", nargs="+", choices=["packed", "padded"], default=["packed", "padded"]
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rows-shown", type=int, default=25)
    args = parser.parse_args()

    from polyrl_engine_kit.launch import run_on_ranks

    with tempfile.TemporaryDirectory(prefix="polyrl_mcore_profile_") as tmp:
        model_dir = str(Path(tmp) / args.shape)
        build_random_model(model_dir, args.shape, tokenizer_from=None, device="cuda")
        torch.cuda.empty_cache()  # the measuring process gets the whole GPU
        run_on_ranks(_rank, 1, args, model_dir, backend="nccl", timeout_s=900)


if __name__ == "__main__":
    main()
