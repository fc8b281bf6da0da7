"""Summarise a GPU run's metrics.jsonl: per-phase time, tokens/s per GPU, training MFU, memory.

MFU of the actor update = 6 * N * tokens / update time / (GPUs * 989 TFLOP/s), N the model's
parameters and 989 TFLOP/s the H200's dense bf16 peak. Attention's own FLOPs (score and value
matmuls, causal, forward and backward: 6 * layers * hidden * sum of squared sequence lengths)
are left out of that figure, as is usual, and printed beside it: sequence lengths come from the
run's mean prompt and response lengths, so that term is an estimate. Steps after the first are
used: the first includes CUDA/NCCL warm-up and graph captures.

    python benchmarks/gpu/report.py RUN_DIR --model /tmp/qwen2-0.5b-random --gpus 1
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PEAK_BF16_FLOPS = 989e12
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("--model", required=True, help="the model folder (config.json)")
    parser.add_argument("--gpus", type=int, required=True)
    args = parser.parse_args()

    model = Path(args.model)
    config = json.loads((model / "config.json").read_text())
    params = float(json.loads((model / "polyrl_random.json").read_text())["parameters"])
    lines = (Path(args.run_dir) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()][1:]
    if not records:
        raise SystemExit("need at least 2 steps (the first is warm-up)")

    def median(key: str) -> float:
        values = [r[key] for r in records if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    print(f"{args.run_dir}: {len(records)} steps after warm-up (medians), {args.gpus} GPU(s)")
    for phase in PHASES:
        print(f"  timing_s/{phase:<15} {median(f'timing_s/{phase}'):8.3f}")
    tokens = median("perf/total_num_tokens")
    update = median("timing_s/update_actor")
    dense = 6 * params * tokens
    mfu = dense / update / (args.gpus * PEAK_BF16_FLOPS)
    seq = median("prompt_length/mean") + median("response_length/mean")
    attention = 6 * config["num_hidden_layers"] * config["hidden_size"] * tokens * seq
    print(f"  tokens per step         {tokens:8.0f} (mean sequence {seq:.0f})")
    print(f"  perf/throughput         {median('perf/throughput'):8.0f} tokens/s per GPU (step)")
    print(f"  update tokens/s per GPU {tokens / update / args.gpus:8.0f}")
    print(f"  update peak memory      {median('actor/peak_memory_gb'):8.1f} GiB (per GPU)")
    print(
        f"  update MFU              {100 * mfu:8.1f} %  = 6 x {params / 1e6:.0f}M params x "
        f"{tokens:.0f} tokens / {update:.3f} s / ({args.gpus} x 989 TFLOP/s)"
    )
    print(
        f"  attention FLOPs         {attention / 1e12:8.2f} TFLOP per step, not in MFU "
        f"(+{100 * attention / dense:.1f}% of 6N; 6 x {config['num_hidden_layers']} layers x "
        f"{config['hidden_size']} x tokens x mean sequence)"
    )


if __name__ == "__main__":
    main()
