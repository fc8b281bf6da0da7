"""Colocated vs split placement (and any other variant) on the same config, side by side.

Each variant is one ``polyrl train`` process (the real CLI, Ray, workers, weight sync) with the
same recipe, steps and common overrides; only the variant's own overrides differ:

* ``colocated``: every one of ``--devices`` workers hosts actor, reference and rollout
  (``trainer.n_gpus_per_node=<devices>``, verl's hybrid engine);
* ``split``: the same devices cut in two pools, half for actor and reference, half for the
  rollout (``actor_rollout_ref.hybrid_engine=false``), weights sent between them after each
  update;
* ``--variant name=override,override``: any other, e.g. one-step off-policy once available
  (``--variant off_policy=<split overrides>,trainer.async_mode=one_step_off``).

Printed, as medians over the steps after ``--warmup`` (markdown, one column per variant): step
time and each phase (``timing_s/*``), tokens/s (prompt + response tokens of the step over its
time), weight-sync seconds, MB and probe difference, the idle share of each pool and the reward
curve. A pool's busy time is the sum of the phases its roles run in (generation: the rollout's
pool; log-probs and update: the actor's and reference's; the weight sync: both); the rest of
the step it waits (on the driver's reward and advantage work, or on the other pool). That
reading assumes phases run one after another, as the synchronous step does; a mode that
overlaps them needs its own accounting.

Usage (CPU, recipe tiny, 1 + 1 workers)::

    python benchmarks/bench_placement.py --steps 12
    # 2-GPU H200 machine: same script, other overrides
    python benchmarks/bench_placement.py --recipe quickstart --devices 2 --steps 12 \\
        trainer.device=cuda
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from polyrl.config import load_config
from polyrl.config.checks.placement import pool_of

# The step's phases (timing_s/<phase>) and the roles whose workers do their work.
PHASE_ROLES = {
    "gen": ("rollout",),
    "old_log_prob": ("actor",),
    "ref": ("ref",),
    "values": ("critic",),
    "update_critic": ("critic",),
    "update_actor": ("actor",),
    "update_weights": ("actor", "rollout"),
}
COMMON = (
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.export_hf_model=false",
)


def default_variants(devices: int) -> dict[str, list[str]]:
    half = max(1, devices // 2)
    return {
        "colocated": [f"trainer.n_gpus_per_node={devices}"],
        "split": [
            "actor_rollout_ref.hybrid_engine=false",
            f"trainer.n_gpus_per_node={half}",
            f"actor_rollout_ref.rollout.n_gpus_per_node={devices - half}",
        ],
    }


def run_variant(recipe: str, steps: int, overrides: list[str], out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "polyrl", "train", f"recipe={recipe}",
           f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={out}",
           *COMMON, *overrides]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def pools(recipe: str, overrides: list[str]) -> dict[str, list[str]]:
    """``{pool: roles}`` of the roles the phases name, as the run places them."""
    cfg = load_config([f"recipe={recipe}", *overrides])
    found: dict[str, list[str]] = {}
    for role in dict.fromkeys(r for roles in PHASE_ROLES.values() for r in roles):
        found.setdefault(pool_of(cfg, role), []).append(role)
    return found


def summarize(records: list[dict], placed: dict[str, list[str]], warmup: int) -> dict[str, Any]:
    timed = records[warmup:] or records

    def median(key: str) -> float | None:
        values = [r[key] for r in timed if key in r]
        return statistics.median(values) if values else None

    row: dict[str, Any] = {}
    phases = [p for p in PHASE_ROLES if median(f"timing_s/{p}") is not None]
    row["step s"] = median("timing_s/step")
    for phase in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"):
        row[f"  {phase} s"] = median(f"timing_s/{phase}")
    row["tokens/s"] = statistics.median(
        r["perf/total_num_tokens"] / r["timing_s/step"] for r in timed
    )
    row["sync s"] = median("weight_sync/seconds")
    row["sync MB"] = (median("weight_sync/bytes") or 0) / 2**20
    row["probe max diff"] = median("weight_sync/probe_logprob_max_diff")
    for pool, roles in placed.items():
        idle = []
        for r in timed:
            busy = sum(
                r[f"timing_s/{p}"]
                for p in phases
                if f"timing_s/{p}" in r and set(PHASE_ROLES[p]) & set(roles)
            )
            idle.append(max(0.0, 1 - busy / r["timing_s/step"]))
        row[f"idle {pool} pool"] = f"{100 * statistics.median(idle):.0f}%"
    scores = [r["critic/score/mean"] for r in records]
    third = max(1, len(scores) // 3)
    row["reward first third"] = statistics.mean(scores[:third])
    row["reward last third"] = statistics.mean(scores[-third:])
    row["reward curve"] = " ".join(f"{s:.2f}" for s in scores)
    return row


def table(rows: dict[str, dict[str, Any]]) -> str:
    names = list(rows)
    # the rows with most keys (a split run's two pools) give the order
    ordered = sorted(rows.values(), key=len, reverse=True)
    keys = list(dict.fromkeys(k for row in ordered for k in row))
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key in keys:
        cells = []
        for name in names:
            value = rows[name].get(key)
            cells.append(
                "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)
            )
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of medians")
    parser.add_argument("--devices", type=int, default=2, help="workers per variant in all")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=OVERRIDE,OVERRIDE",
        help="another variant (repeatable), e.g. off-policy once it lands",
    )
    parser.add_argument("--only", nargs="*", help="run only these variants")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for every variant")
    args = parser.parse_args()

    variants = default_variants(args.devices)
    for spec in args.variant:
        name, _, rest = spec.partition("=")
        variants[name] = [o for o in rest.split(",") if o]
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only}
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_placement_") as tmp:
        for name, own in variants.items():
            overrides = [*args.overrides, *own]
            before = os.getloadavg()[0]
            start = time.perf_counter()
            records = run_variant(args.recipe, args.steps, overrides, Path(tmp) / name)
            wall = time.perf_counter() - start
            rows[name] = summarize(records, pools(args.recipe, overrides), args.warmup)
            rows[name]["whole run s"] = wall
            rows[name]["load avg before/after"] = f"{before:.1f}/{os.getloadavg()[0]:.1f}"
            print(f"{name}: {wall:.0f} s ({' '.join(overrides)})", file=sys.stderr)
            # the table so far after every variant: a run cut short keeps what it measured
            print(
                f"recipe={args.recipe}, {args.steps} steps, medians over steps "
                f"{args.warmup + 1}.., {args.devices} worker(s) per variant"
            )
            print(table(rows), flush=True)


if __name__ == "__main__":
    main()
