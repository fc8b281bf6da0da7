"""Synchronous, one-step, k-step off-policy training and k-step with partial rollouts side by
side on CPU: rollout-pool idle share, samples/s and the final validation reward, one
``polyrl train`` run per mode.

Every run is ``recipe=grpo`` with split placement (1 trainer + 1 rollout worker), the same seed
and data, and long-tailed response lengths: ``data.max_response_length`` is raised so that the
randomly initialised model's responses run from a few tokens (an early EOS) to the limit, and a
batch takes as long as its longest response. The step count is one more than a multiple of
every k, so no round of generation reaches past the last step. Partial rollouts
(``trainer.off_policy.partial_rollout=continue``) generate in chunks of ``--chunk-tokens`` and
take new weights between chunks after every update.

From each run's ``metrics.jsonl``: wall time = the sum of ``timing_s/step``; the rollout pool
is busy for ``timing_s/gen`` + ``timing_s/update_weights`` of every step (generation of a batch
made ahead is timed in that batch's own step; with partial rollouts, the sum of its chunks);
idle % = 1 - busy / wall; samples/s = responses trained / wall; the medians of
``timing_s/step`` and ``timing_s/gen``; the largest staleness of a sample (its oldest token).

    python benchmarks/bench_async.py        # sync, one_step_off, k_step_off k=3 (with partial)
    python benchmarks/bench_async.py --steps 25 --k 2 4 --json async.json
    python benchmarks/bench_async.py --only "k_step_off k=3 partial" --partial continue abort
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SAMPLES_PER_STEP = 32  # recipe=grpo: data.train_batch_size 8 x actor_rollout_ref.rollout.n 4
VAL = "val-core/polyrl/tiny_digits/reward/mean@1"
SPLIT = (
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
    "trainer.save_freq=-1",
    "trainer.export_hf_model=false",
)


def modes(ks: list[int], partial: list[str], chunk_tokens: int) -> dict[str, tuple[str, ...]]:
    runs = {
        "sync": ("trainer.async_mode=sync",),
        "one_step_off": ("trainer.async_mode=one_step_off",),
    }
    for k in ks:
        runs[f"k_step_off k={k}"] = (
            "trainer.async_mode=k_step_off",
            f"trainer.off_policy.max_off_policy_threshold={k}",
        )
        for policy in partial:
            runs[f"k_step_off k={k} partial_rollout={policy}"] = (
                *runs[f"k_step_off k={k}"],
                f"trainer.off_policy.partial_rollout={policy}",
                f"trainer.off_policy.partial_rollout_chunk_tokens={chunk_tokens}",
            )
    return runs


def train(out: Path, steps: int, response_length: int, mode: tuple[str, ...]) -> list[dict]:
    cmd = [
        sys.executable, "-m", "polyrl", "train", "recipe=grpo",
        f"trainer.default_local_dir={out}", f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}", f"data.max_response_length={response_length}",
        *SPLIT, *mode,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def summary(records: list[dict]) -> dict[str, float]:
    steps = [r for r in records if r["step"] > 0]
    wall = sum(r["timing_s/step"] for r in steps)
    busy = sum(r.get("timing_s/gen", 0.0) + r.get("timing_s/update_weights", 0.0) for r in steps)
    return {
        "rollout_idle_pct": 100.0 * max(0.0, 1.0 - busy / wall),
        "samples_per_s": SAMPLES_PER_STEP * len(steps) / wall,
        "median_step_s": statistics.median(r["timing_s/step"] for r in steps),
        "median_gen_s": statistics.median(r.get("timing_s/gen", 0.0) for r in steps),
        "max_staleness": max(r.get("async/staleness/max", 0.0) for r in steps),
        "final_val_reward": steps[-1].get(VAL, float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--k", type=int, nargs="+", default=[3])
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--partial", nargs="*", default=["continue"], choices=["continue", "abort"])
    parser.add_argument("--chunk-tokens", type=int, default=16)
    parser.add_argument("--only", nargs="+", help="run only the modes whose name starts so")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = {}
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-async-") as tmp:
        for name, mode in modes(args.k, args.partial, args.chunk_tokens).items():
            if args.only and not name.startswith(tuple(args.only)):
                continue
            records = train(
                Path(tmp) / name.replace(" ", "_").replace("=", ""),
                args.steps,
                args.response_length,
                mode,
            )
            report[name] = summary(records)
            print(name, json.dumps(report[name]), file=sys.stderr)
    print("| mode | rollout idle % | samples/s | median step s | median gen s | max staleness "
          "| final val reward |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, row in report.items():
        print(
            f"| {name} | {row['rollout_idle_pct']:.0f} | {row['samples_per_s']:.1f} | "
            f"{row['median_step_s']:.2f} | {row['median_gen_s']:.2f} | "
            f"{row['max_staleness']:.0f} | {row['final_val_reward']:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
