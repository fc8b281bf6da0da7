"""Generation tokens/s of the ``hf`` rollout at one shape, against the roofline (issue 25).

One process, one code path: the installed ``polyrl_rollout_hf``, or with ``--source DIR`` the
package found under ``DIR`` (e.g. an export of an older commit: the baseline runs in its own
process, on the same machine, right before or after). A random model of ``--shape`` (built on the
GPU; random weights almost never emit EOS, so every row decodes to the limit) generates
``--prompts`` x ``--n`` rows of ``--max-new-tokens`` after ``--prompt-len``-token prompts; the
first call (compile, CUDA graph captures) is timed apart, then the median of ``--runs``.

The roofline of one decode step with ``R`` rows, printed with its numbers:

    bytes  = 2 N (bf16 weights, the tied embedding read once as the output head)
             + R x L x kv        (kv = 2 x layers x KV heads x head dim x 2 bytes per cached token;
                                  L = the cache columns the step reads: the static cache's length
                                  bucket here, the live context alone at best)
    flops  = 2 N R + 4 R x layers x heads x head dim x context
    step  >= max(bytes / HBM bandwidth, flops / bf16 peak);   tokens/s <= R / step

    python benchmarks/gpu/bench_decode.py --shape qwen2-0.5b --prompts 32 --n 8 --max-new-tokens 256
    python benchmarks/gpu/bench_decode.py --source .baseline/plugins/rollout_hf/src ...  # older
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Measured or datasheet rates per GPU: (HBM bytes/s, dense bf16 FLOP/s).
RATES = {"H200": (4.3e12, 790e12), "H100": (3.35e12, 790e12)}


def roofline(config: dict, params: int, rows: int, columns: int, context: float, rates) -> dict:
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    kv = 2 * layers * kv_heads * head_dim * 2
    weights = 2 * params
    bandwidth, peak = rates
    flops = 2 * params * rows + 4 * rows * layers * heads * head_dim * context
    out = {"kv_bytes_per_token": kv, "weights_bytes": weights, "flops_per_step": flops}
    for name, read in (("static", columns), ("live", context)):
        total = weights + rows * read * kv
        step = max(total / bandwidth, flops / peak)
        out[name] = {"bytes_per_step": total, "step_s": step, "tokens_per_s": rows / step}
    return out


def profile_steps(engine, prompts, params, out_dir: str | None) -> None:
    """Kernels of one call under torch.profiler: GPU time by kernel, and kernels per step."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        engine.generate(prompts, params)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    averages = prof.key_averages()
    table = averages.table(sort_by="cuda_time_total", row_limit=25)
    table += "\n" + averages.table(sort_by="cpu_time_total", row_limit=15)
    # Whether the device or the host sets the pace: the kernels' summed device time against the
    # call's wall time (under the profiler, so both are inflated somewhat).
    kernels = [e for e in averages if str(e.device_type).endswith("CUDA")]
    busy = sum(e.self_device_time_total for e in kernels) / 1e6
    table += f"\nwall {wall:.3f} s, kernels' device time {busy:.3f} s ({100 * busy / wall:.0f} %)\n"
    print(table)
    if out_dir:
        Path(out_dir, "profile.txt").write_text(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2-0.5b")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--slots", type=int, default=None, help="micro_batch_size (rows)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    parser.add_argument("--source", default=None, help="import polyrl_rollout_hf from here")
    parser.add_argument("--label", default=None)
    parser.add_argument("--hf", default="{}", help="engine_kwargs.hf as JSON")
    parser.add_argument("--greedy-out", default=None, help="save greedy tokens (.pt) here")
    parser.add_argument("--profile", default=None, help="a folder for the profile (or '-')")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.source:
        sys.path.insert(0, str(Path(args.source).resolve()))

    import torch

    import polyrl_rollout_hf
    from polyrl.batch import Batch
    from polyrl.interfaces import RolloutContext, SamplingParams
    from polyrl.models.shapes import build_random_model
    from polyrl_rollout_hf.engine import HFRolloutEngine

    label = args.label or ("baseline" if args.source else "current")
    rows = args.prompts * args.n
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        build_random_model(folder, args.shape, device=args.device)
        config = json.loads(Path(folder, "config.json").read_text())
        ctx = RolloutContext(
            model_path=folder,
            config={
                "dtype": "bfloat16",
                "micro_batch_size": args.slots or rows,
                "gpu_memory_utilization": 0.9,
                "engine_kwargs": {"hf": json.loads(args.hf)},
            },
            device=args.device,
            rank=0,
            world_size=1,
            pad_token_id=int(config.get("pad_token_id") or 0),
            eos_token_ids=[int(config["eos_token_id"])],
        )
        engine = HFRolloutEngine(ctx)
    params_count = sum(p.numel() for p in engine.model.parameters())
    ids = torch.randint(
        3, 400, (args.prompts, args.prompt_len), generator=torch.Generator().manual_seed(0)
    )
    prompts = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    sample = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, seed=0)

    cuda = args.device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def timed(params) -> tuple[float, int, Batch]:
        sync()
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        sync()
        return time.perf_counter() - start, int(out["response_mask"].sum()), out

    first_s, _, _ = timed(sample)
    seconds, tokens = [], 0
    for _ in range(args.runs):
        elapsed, tokens, _ = timed(sample)
        seconds.append(elapsed)
    median = statistics.median(seconds)
    greedy = SamplingParams(n=1, max_new_tokens=min(64, args.max_new_tokens), greedy=True)
    _, _, greedy_out = timed(greedy)
    if args.greedy_out:
        torch.save(greedy_out["responses"], args.greedy_out)

    name = torch.cuda.get_device_name() if cuda else "cpu"
    rates = next((r for key, r in RATES.items() if key in name), RATES["H100"])
    from polyrl_rollout_hf.static_decode import MIN_LENGTH_BUCKET, bucket

    columns = bucket(args.prompt_len + args.max_new_tokens, MIN_LENGTH_BUCKET)
    context = args.prompt_len + args.max_new_tokens / 2
    roof = roofline(config, params_count, rows, columns, context, rates)
    rate = tokens / median
    result = {
        "label": label,
        "source": str(Path(polyrl_rollout_hf.__file__).parent),
        "device": name,
        "torch": torch.__version__,
        "shape": args.shape,
        "rows": rows,
        "prompt_len": args.prompt_len,
        "max_new_tokens": args.max_new_tokens,
        "hf": json.loads(args.hf),
        "first_call_s": first_s,
        "runs_s": seconds,
        "median_s": median,
        "tokens": tokens,
        "tokens_per_s": rate,
        "process_to_first_result_s": time.perf_counter() - started,
        "roofline": roof,
        "rates": {"hbm_bytes_per_s": rates[0], "bf16_flops": rates[1]},
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
    print(
        f"\n[{label}] {args.shape} ({params_count / 1e6:.0f}M), {rows} rows x "
        f"{args.max_new_tokens} new tokens after {args.prompt_len}, bf16, {name}, "
        f"torch {torch.__version__}\n  first call {first_s:.2f} s (compile + capture + one run); "
        f"runs {' '.join(f'{s:.3f}' for s in seconds)} s; median {median:.3f} s = "
        f"{rate:,.0f} tokens/s"
    )
    for kind in ("static", "live"):
        r, read = roof[kind], columns if kind == "static" else context
        print(
            f"  roofline ({kind} KV read): bytes/step = 2N + R L kv = "
            f"{roof['weights_bytes'] / 1e9:.2f} GB + {rows} x {read:.0f} x "
            f"{roof['kv_bytes_per_token']} B = {r['bytes_per_step'] / 1e9:.2f} GB -> "
            f"{r['bytes_per_step'] / rates[0] * 1e3:.3f} ms at {rates[0] / 1e12:.1f} TB/s; "
            f"flops/step = {roof['flops_per_step'] / 1e12:.3f} T -> "
            f"{roof['flops_per_step'] / rates[1] * 1e3:.3f} ms at {rates[1] / 1e12:.0f} TFLOP/s; "
            f"ceiling {r['tokens_per_s']:,.0f} tokens/s; measured "
            f"{100 * rate / r['tokens_per_s']:.1f} % of it"
        )
    if args.profile:
        profile_steps(engine, prompts, sample, None if args.profile == "-" else args.profile)
    if args.json:
        with open(args.json, "a") as handle:
            handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
