"""Summarise a GPU run's metrics.jsonl: per-phase time, tokens/s per GPU and training MFU.

MFU of the actor update = 6 * parameters * trained tokens / update time / (GPUs * peak), with the
H200's dense bf16 peak of 989 TFLOP/s (attention FLOPs are left out, so this slightly
under-states the utilisation at long sequence lengths). Steps after the first are used: the
first includes CUDA/NCCL warm-up.

    python benchmarks/gpu/report.py RUN_DIR --params 494e6 --gpus 1
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
    parser.add_argument("--params", type=float, required=True, help="model parameters")
    parser.add_argument("--gpus", type=int, required=True)
    args = parser.parse_args()

    lines = (Path(args.run_dir) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()][1:]
    if not records:
        raise SystemExit("need at least 2 steps (the first is warm-up)")

    def median(key: str) -> float:
        values = [r[key] for r in records if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    print(f"{args.run_dir}: {len(records)} steps after warm-up, {args.gpus} GPU(s)")
    for phase in PHASES:
        print(f"  timing_s/{phase:<15} {median(f'timing_s/{phase}'):8.3f}")
    tokens = median("perf/total_num_tokens")
    update = median("timing_s/update_actor")
    mfu = 6 * args.params * tokens / update / (args.gpus * PEAK_BF16_FLOPS)
    print(f"  tokens per step         {tokens:8.0f}")
    whole_step = median("perf/throughput")
    print(f"  perf/throughput         {whole_step:8.0f} tokens/s per GPU (whole step)")
    print(f"  update tokens/s per GPU {tokens / update / args.gpus:8.0f}")
    print(f"  training-phase MFU      {100 * mfu:8.1f} %")


if __name__ == "__main__":
    main()
