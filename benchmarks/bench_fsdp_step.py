"""Throughput and MFU of the FSDP2 engine's ``train_step`` (and ``compute_log_prob``).

A randomly initialised model of a real shape (default: Qwen2-0.5B; the shapes are
``polyrl.models.shapes.SHAPES``) is written to a temporary folder, loaded by
:class:`polyrl_engine_fsdp.engine.FSDPEngine` on each rank, and trained on random token batches
in polyrl's layout (left-padded prompt + right-padded response). Printed: seconds per step,
tokens/s per device and MFU.

Model FLOPs per step (the usual convention; recomputation under gradient checkpointing is not
counted): ``6 x (non-embedding matmul params) x tokens`` + ``6 x vocab x hidden x response
tokens`` (the engine computes logits only at response positions) + causal attention
``3 x (4 x T^2 x heads x head_dim / 2)`` per row and layer (QK^T and AV, half masked, forward
plus twice for backward). MFU divides by the step time and ``--peak-tflops``
per device (989 for an H200's dense bf16).

    # on the GPU machine (the lead runs GPU jobs):
    python benchmarks/bench_fsdp_step.py --device cuda --world-size 1
    # quick check on CPU:
    python benchmarks/bench_fsdp_step.py --shape tiny --device cpu \
        --batch 4 --prompt-len 16 --response-len 16 --steps 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import torch

from polyrl.models.shapes import SHAPES, build_random_model


def make_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int) -> Any:
    """Full-length rows except a little padding, so the figures are of real tokens."""
    from polyrl.batch import Batch

    gen = torch.Generator().manual_seed(seed)
    width = prompt_len + response_len
    ids = torch.randint(1, vocab, (rows, width), generator=gen)
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[::2, :1] = 0  # every other prompt one token shorter (left padding)
    mask[1::2, -1:] = 0  # and every other response one token shorter (right padding)
    ids = ids * mask
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, prompt_len:].clone(),
            "response_mask": mask[:, prompt_len:].clone(),
        }
    )


def token_mean_nll(micro: Any, log_prob: torch.Tensor, entropy: Any) -> Any:
    mask = micro["response_mask"].to(log_prob.dtype)
    loss = -(log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"]
    return loss, {"actor/pg_loss": float(loss.detach())}


def model_flops(config: Any, batch: Any) -> float:
    """Training FLOPs of one step on ``batch`` (see the module docstring)."""
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = config.intermediate_size
    per_layer = (
        hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 3 * hidden * inter
    )
    lengths = batch["attention_mask"].sum(1).double()
    tokens = float(lengths.sum())
    response_tokens = float(batch["response_mask"].sum())
    attention = 3.0 * layers * (4.0 * float((lengths**2).sum()) * heads * head_dim / 2)
    return 6.0 * per_layer * layers * tokens + 6.0 * vocab * hidden * response_tokens + attention


def _rank(rank: int, world: int, args: argparse.Namespace, model_dir: str) -> dict[str, Any]:
    from polyrl.interfaces import EngineContext
    from polyrl_engine_fsdp.engine import FSDPEngine

    ctx = EngineContext(
        role="actor",
        model_path=model_dir,
        model={
            "dtype": "bfloat16",
            "enable_gradient_checkpointing": args.grad_ckpt,
        },
        engine={
            "ppo_micro_batch_size_per_gpu": args.micro_batch,
            "use_dynamic_bsz": args.max_tokens > 0,
            "ppo_max_token_len_per_gpu": max(args.max_tokens, 1),
            "optim": {"lr": 1e-6, "clip_grad": 1.0},
            "fsdp_config": {"mixed_precision": True, "reshard_after_forward": True},
        },
        device=args.device,
        rank=rank,
        world_size=world,
        seed=0,
        total_training_steps=args.steps + args.warmup,
    )
    engine = FSDPEngine(ctx)
    vocab = engine.hf_config.vocab_size
    batches = [
        make_batch(args.batch, args.prompt_len, args.response_len, vocab, seed=100 * rank + s)
        for s in range(args.steps + args.warmup)
    ]

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    train_times, logprob_times = [], []
    for i, batch in enumerate(batches):
        sync()
        start = time.perf_counter()
        engine.compute_log_prob(batch)
        sync()
        middle = time.perf_counter()
        engine.train_step(batch, token_mean_nll)
        sync()
        if i >= args.warmup:
            logprob_times.append(middle - start)
            train_times.append(time.perf_counter() - middle)
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else 0.0
    return {
        "train_s": statistics.median(train_times),
        "logprob_s": statistics.median(logprob_times),
        "flops": model_flops(engine.hf_config, batches[-1]),
        "tokens": float(batches[-1]["attention_mask"].sum()),
        "peak_mem_gib": peak_mem,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-0.5b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8, help="rows per rank per step")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=768)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=0, help=">0: dynamic token budget")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    args = parser.parse_args()

    from polyrl_engine_kit.launch import run_on_ranks

    with tempfile.TemporaryDirectory(prefix="bench_fsdp_") as folder:
        start = time.perf_counter()
        model_dir = build_random_model(
            os.path.join(folder, "model"), args.shape, tokenizer_from=None, dtype="bfloat16"
        )
        print(f"random {args.shape} written in {time.perf_counter() - start:.1f} s")
        results = run_on_ranks(
            _rank,
            args.world_size,
            args,
            model_dir,
            backend="nccl" if args.device == "cuda" else "gloo",
            timeout_s=3600,
            threads_per_rank=args.threads,
        )
    step = max(r["train_s"] for r in results)
    logprob = max(r["logprob_s"] for r in results)
    tokens = results[0]["tokens"]
    flops = results[0]["flops"]
    print(
        f"shape={args.shape} device={args.device} ranks={args.world_size} rows/rank={args.batch} "
        f"T={args.prompt_len}+{args.response_len} micro={args.micro_batch} "
        f"max_tokens={args.max_tokens} grad_ckpt={args.grad_ckpt}"
    )
    print(f"train_step       {step:.3f} s   {tokens / step:,.0f} tokens/s per device")
    print(f"compute_log_prob {logprob:.3f} s   {tokens / logprob:,.0f} tokens/s per device")
    print(
        f"model TFLOP/step per device {flops / 1e12:.2f}   achieved {flops / step / 1e12:.1f} "
        f"TFLOP/s   MFU {100 * flops / step / (args.peak_tflops * 1e12):.1f}% "
        f"(peak {args.peak_tflops:.0f} TFLOP/s)"
    )
    if args.device == "cuda":
        print(f"peak memory {max(r['peak_mem_gib'] for r in results):.1f} GiB")


if __name__ == "__main__":
    main()
