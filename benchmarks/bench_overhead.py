"""How much of a polyrl training step is framework overhead rather than engine work?

The same config runs twice, each in its own process, through polyrl's real trainer
(:class:`polyrl.trainer.trainer.RLTrainer`, the real stage pipeline):

* ``ray``:   the normal path, workers are Ray actors;
* ``local``: the worker lives in the driver process (polyrl's Ray-free
  :class:`~polyrl.workers.local.LocalWorkerGroup` with one rank): no Ray calls, no
  serialisation, no process boundary.

In both, the worker is ``TimedWorker``, a subclass of polyrl's Worker that times the engines'
own calls (rollout ``generate``, actor ``compute_log_prob`` / ``train_step``,
rollout ``update_weights`` including the weight gather that feeds it). After each step the driver
collects those times outside the timed step.

Per phase, the driver's ``timing_s/<phase>`` minus the engine time inside it is overhead:
data movement through the controller (splitting, concatenating, padding and copying batches,
``.to("cpu")``), Ray calls and serialisation, and in ``reward``/``adv`` the scoring and advantage
computation on the driver. ``ray`` minus ``local`` is what Ray and the process boundary cost.

Usage: ``python benchmarks/bench_overhead.py [--recipe tiny|quickstart] [--steps 6]
[--warmup 1] [hydra overrides ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from polyrl.config import to_container

ENGINE_CALLS = {
    # role, engine method: the engine phase, which is also the driver stage it runs in
    ("rollout", "generate"): "gen",
    ("actor", "compute_log_prob"): "old_log_prob",
    ("ref", "compute_log_prob"): "ref",
    ("actor", "train_step"): "update_actor",
    ("rollout", "update_weights"): "update_weights",
}


def _timed_worker_class() -> type:
    from polyrl.workers.worker import Worker

    class TimedWorker(Worker):
        """A Worker whose roles' engine calls are timed (wall time, per phase, summed)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._engine_s: dict[str, float] = defaultdict(float)
            for (role, method), phase in ENGINE_CALLS.items():
                if role in self.roles:
                    engine = self.roles[role].engine
                    setattr(engine, method, self._timed(phase, getattr(engine, method)))

        def _timed(self, phase: str, fn: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self._engine_s[phase] += time.perf_counter() - start

            return wrapper

        def pop_engine_timings(self) -> dict[str, float]:
            out = dict(self._engine_s)
            self._engine_s.clear()
            return out

    return TimedWorker


def _local_role_workers(cfg: Any, roles: tuple[str, ...], **kwargs: Any) -> Any:
    """``start_role_workers`` without Ray: one Worker in the driver process, its own 1-rank
    gloo group."""
    from polyrl.workers.local import LocalWorkerGroup
    from polyrl.workers.placement import RoleWorkers, plan_pools

    plan = plan_pools(cfg, roles)
    if list(plan) != ["global"] or plan["global"].size != 1:
        raise SystemExit("the local mode runs one worker: pass trainer.n_gpus_per_node=1")
    os.environ["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)  # what Ray gives a lone worker
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    group = LocalWorkerGroup(
        kwargs.pop("worker_cls"),
        world_size=1,
        ready_timeout_s=None,
        init_kwargs={
            "cfg": to_container(cfg),
            "roles": plan["global"].roles,
            "plan": kwargs["plan"],
            "model_path": kwargs["model_path"],
            "total_training_steps": kwargs["total_training_steps"],
            "tokens": kwargs["tokens"],
            "master_addr": "127.0.0.1",
            "master_port": port,
        },
    )
    pad = kwargs["tokens"]["pad_token_id"]
    return RoleWorkers(
        {"global": group},
        {role: "global" for role in plan["global"].roles},
        pad_values={"input_ids": pad, "responses": pad},
    )


def child(mode: str, recipe: str, overrides: list[str], out: str) -> None:
    """Train with the timed worker; write per-step driver and engine times to ``out``."""
    import functools

    import polyrl.trainer.trainer as trainer_mod
    from polyrl.config import load_config

    start = _local_role_workers if mode == "local" else trainer_mod.start_role_workers
    trainer_mod.start_role_workers = functools.partial(start, worker_cls=_timed_worker_class())
    if mode == "local":
        trainer_mod.ensure_ray = lambda **_: None
    cfg = load_config([f"recipe={recipe}", *overrides])
    records: list[dict[str, float]] = []
    original = trainer_mod.RLTrainer._train_step

    def train_step(self: Any, step: int) -> dict[str, float]:
        metrics = original(self, step)
        group = self.workers.groups["global"]
        per_rank = group.run("pop_engine_timings", [()] * group.world_size)
        record = {k: v for k, v in metrics.items() if k.startswith("timing_s/")}
        record["tokens"] = metrics["perf/total_num_tokens"]
        for phase in {p for rank in per_rank for p in rank}:
            # ranks run in parallel: the slowest one bounds the phase
            record[f"engine_s/{phase}"] = max(rank.get(phase, 0.0) for rank in per_rank)
        records.append(record)
        return metrics

    trainer_mod.RLTrainer._train_step = train_step
    trainer = trainer_mod.RLTrainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    Path(out).write_text(json.dumps(records))


def derive(record: dict[str, float]) -> dict[str, float]:
    """Per-step overheads: driver phase time minus the engine time inside it."""
    phases = [k.removeprefix("timing_s/") for k in record if k.startswith("timing_s/")]
    phases = [p for p in phases if p != "step"]
    out = dict(record)
    for phase in phases:
        out[f"overhead_s/{phase}"] = record[f"timing_s/{phase}"] - record.get(
            f"engine_s/{phase}", 0
        )
    out["timing_s/(between stages)"] = record["timing_s/step"] - sum(
        record[f"timing_s/{p}"] for p in phases
    )
    out["overhead_s/(between stages)"] = out["timing_s/(between stages)"]
    out["engine_s/total"] = sum(v for k, v in record.items() if k.startswith("engine_s/"))
    out["overhead_s/total"] = record["timing_s/step"] - out["engine_s/total"]
    return out


def table(name: str, records: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """Print medians over the measured steps (each column's median of per-step values)."""
    measured = [derive(r) for r in (records[warmup:] or records)]
    med = {
        key: statistics.median(r.get(key, 0.0) for r in measured)
        for key in sorted({k for r in measured for k in r})
    }
    step = med["timing_s/step"]
    print(
        f"\n[{name}] median over {len(measured)} steps: step {step:.3f} s, "
        f"{med['tokens'] / step:.0f} tokens/s"
    )
    print(
        f"  {'phase':18s} {'driver s':>9s} {'engine s':>9s} {'overhead s':>10s} {'% of step':>9s}"
    )
    phases = [k.removeprefix("timing_s/") for k in med if k.startswith("timing_s/")]
    for phase in [p for p in phases if p != "step"] + ["total"]:
        driver = step if phase == "total" else med[f"timing_s/{phase}"]
        engine = med.get(f"engine_s/{phase}", 0.0)
        over = med[f"overhead_s/{phase}"]
        print(f"  {phase:18s} {driver:9.3f} {engine:9.3f} {over:10.3f} {100 * over / step:8.1f}%")
    med["overhead_share"] = med["overhead_s/total"] / step
    return med


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--modes", default="ray,local")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", choices=("ray", "local"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args(argv)
    if args.child:
        child(args.child, args.recipe, overrides, args.out)
        return 0

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="polyrl-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    common = [
        f"trainer.total_training_steps={args.steps}",
        "trainer.n_gpus_per_node=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.export_hf_model=false",
        "trainer.logger=[jsonl]",
    ]
    load = os.getloadavg()[0]
    print(
        f"recipe={args.recipe}, {args.steps} steps, overrides {overrides or 'none'}; "
        f"load average {load:.1f}; "
        f"logs in {work}",
        flush=True,
    )
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    summary = {}
    for mode in args.modes.split(","):
        out = work / f"{mode}.json"
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            mode,
            "--recipe",
            args.recipe,
            "--out",
            str(out),
            *common,
            f"trainer.default_local_dir={work / mode}",
            *overrides,
        ]
        with open(work / f"{mode}.log", "w") as log:
            code = subprocess.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        if code:
            print((work / f"{mode}.log").read_text()[-3000:])
            return code
        summary[mode] = table(mode, json.loads(out.read_text()), args.warmup)
    if "ray" in summary and "local" in summary:
        r, loc = summary["ray"]["timing_s/step"], summary["local"]["timing_s/step"]
        print(
            f"\nRay and the process boundary: {r - loc:+.3f} s per step "
            f"({100 * (r - loc) / r:.1f}% of the Ray step)"
        )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
