"""polyrl vs TRL's GRPOTrainer: the same GRPO run, one after the other, on this machine.

Both sides get the same model folder, the same train parquet (a polyrl ``builtin:`` data spec,
materialised once), the same prompts per step, samples per prompt, response length, learning
rate, number of steps and dtype policy, and the same reward function (polyrl's built-in scorer
for the row's ``data_source``). Each side runs in its own process:

* polyrl: ``python -m polyrl train`` (Ray, the FSDP2 engine and the HF rollout), per-step times
  read back from its ``metrics.jsonl`` (``timing_s/*``, ``perf/total_num_tokens``);
* TRL: a child of this script started with the benchmark environment's Python (TRL is installed
  there only, see ``benchmarks/README.md``): ``--trl-python PATH``, else ``$POLYRL_TRL_PYTHON``,
  else this script's own Python when it can import ``trl``; per-step times from a
  ``TrainerCallback``, the generation phase timed around ``_generate_and_score_completions``.

The summary prints, for each side, the median wall time per step (the first ``--warmup`` steps
left out), prompt+response tokens per second over the measured steps, the whole run's wall time,
and the ratio polyrl / TRL. Run ``--help`` for the knobs; ``benchmarks/README.md`` lists the
commands behind the published figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRL_PYTHON_ENV = "POLYRL_TRL_PYTHON"
MODELS = {"tiny": "builtin:tiny", "smollm2": "builtin:smollm2-135m-instruct"}
DATA = {
    "tiny": "builtin:tiny_digits",
    "smollm2": "builtin:reasoning_gym/chain_sum?train_size=1024&val_size=32"
    "&min_terms=2&max_terms=2&min_digits=1&max_digits=1",
}


# ---- shared ------------------------------------------------------------------------------------
def summarise(steps: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """Medians over the steps after ``warmup``: seconds per step, and tokens/s (each step's
    prompt+response tokens over its time; medians resist the noise of a shared machine)."""
    measured = steps[warmup:] or steps
    times = [s["step_s"] for s in measured]
    tokens = sum(s["tokens"] for s in measured)
    out = {
        "steps_measured": len(measured),
        "median_step_s": statistics.median(times),
        "tokens_per_s": statistics.median(s["tokens"] / s["step_s"] for s in measured),
        "tokens_per_step": tokens / len(measured),
    }
    for key in sorted({k for s in measured for k in s if k.startswith("phase/")}):
        out[f"median_{key}"] = statistics.median(s.get(key, 0.0) for s in measured)
    return out


# ---- the polyrl side ----------------------------------------------------------------------------
def polyrl_overrides(args: argparse.Namespace, model: str, train: str, out: str) -> list[str]:
    bf16 = args.dtype == "bf16"
    dtype = "bfloat16" if bf16 else "float32"
    rows = args.batch * args.n
    micro = args.micro_batch or rows
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        "data.val_files=null",
        f"data.train_batch_size={args.batch}",
        f"data.max_prompt_length={args.max_prompt_length}",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.dtype={dtype}",
        f"actor_rollout_ref.actor.fsdp_config.mixed_precision={str(bf16).lower()}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.dtype={dtype}",
        f"actor_rollout_ref.rollout.micro_batch_size={rows}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.device={args.device}",
        f"trainer.n_gpus_per_node={args.workers}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.export_hf_model=false",
        "trainer.logger=[jsonl]",
        f"trainer.seed={args.seed}",
        f"trainer.default_local_dir={out}",
    ]


def run_polyrl(args: argparse.Namespace, model: str, train: str, work: Path) -> dict:
    out = work / "polyrl"
    cmd = [args.polyrl_python, "-m", "polyrl", "train"]
    cmd += polyrl_overrides(args, model, f'"{train}"', str(out))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    start = time.perf_counter()
    _run(cmd, env, work / "polyrl.log")
    wall = time.perf_counter() - start
    steps = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        step = {"step_s": record["timing_s/step"], "tokens": record["perf/total_num_tokens"]}
        for key, value in record.items():
            if key.startswith("timing_s/") and key != "timing_s/step":
                step[f"phase/{key.removeprefix('timing_s/')}"] = value
        step["reward"] = record.get("critic/score/mean", float("nan"))
        steps.append(step)
    return {"wall_s": wall, "steps": steps}


# ---- the TRL side -------------------------------------------------------------------------------
def resolve_trl_python(given: str | None) -> str:
    """The Python that runs the TRL side: ``--trl-python``, else ``$POLYRL_TRL_PYTHON``, else
    this interpreter if it can import ``trl``. A clear error when none is found, or when the one
    named is missing or cannot import ``trl``."""
    source = "--trl-python" if given else f"${TRL_PYTHON_ENV}"
    candidate = given or os.environ.get(TRL_PYTHON_ENV)
    if not candidate:
        if importlib.util.find_spec("trl") is not None:
            return sys.executable
        raise SystemExit(
            "bench_vs_trl: the TRL side needs the Python of an environment where trl is "
            f"installed: pass --trl-python PATH or set {TRL_PYTHON_ENV}=PATH (benchmarks/README.md "
            "shows how to build that environment), run this script with that Python, or pass "
            "--only polyrl"
        )
    path = shutil.which(candidate)
    if path is None:
        raise SystemExit(f"bench_vs_trl: {source}={candidate!r} is not an executable Python")
    check = subprocess.run([path, "-c", "import trl"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"bench_vs_trl: {source}={candidate!r} cannot import trl: {last}")
    return path


def run_trl(args: argparse.Namespace, model: str, train: str, work: Path) -> dict:
    result = work / "trl.json"
    cmd = [
        args.trl_python,
        os.path.abspath(__file__),
        "--child-trl",
        "--model-path",
        model,
        "--train-parquet",
        train,
        "--result",
        str(result),
        "--out",
        str(work / "trl"),
    ]
    keys = ("steps", "batch", "n", "micro_batch", "response_length", "lr", "dtype", "seed")
    for key in (*keys, "threads", "device"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    start = time.perf_counter()
    _run(cmd, dict(os.environ), work / "trl.log")
    data = json.loads(result.read_text())
    data["wall_s"] = time.perf_counter() - start
    return data


def trl_child(args: argparse.Namespace) -> None:
    """Runs inside the benchmark environment: TRL's GRPOTrainer on the polyrl parquet."""
    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from polyrl.rewards.scorers import default_compute_score

    torch.set_num_threads(args.threads)
    rows = pq.read_table(args.train_parquet).to_pylist()
    dataset = Dataset.from_list(
        [
            {
                "prompt": row["prompt"],
                "data_source": row["data_source"],
                "ground_truth": row["reward_model"]["ground_truth"],
                "extra_info": json.dumps(row.get("extra_info") or {}),
            }
            for row in rows
        ]
    )

    def reward(completions, data_source, ground_truth, extra_info, **_):
        scores = []
        for completion, source, truth, extra in zip(
            completions, data_source, ground_truth, extra_info
        ):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            value = default_compute_score(source, text, truth, json.loads(extra))
            scores.append(float(value["score"] if isinstance(value, dict) else value))
        return scores

    bf16 = args.dtype == "bf16"
    rows = args.batch * args.n
    micro = args.micro_batch or rows
    config = GRPOConfig(
        output_dir=args.out,
        # micro-batches of `micro` rows accumulated over the step's rows: one optimizer step per
        # generation batch of `rows`, as polyrl's single on-policy mini-batch
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,
        num_generations=args.n,
        max_completion_length=args.response_length,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",  # token-level mean over the batch, as polyrl's token-mean
        scale_rewards="group",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        use_cpu=args.device == "cpu",
        bf16=bf16,
        model_init_kwargs={"dtype": torch.float32},  # fp32 master weights, as polyrl's FSDP
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=args.seed,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    steps: list[dict[str, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_args, **_kwargs):
            self.start = time.perf_counter()
            self.gen_s = 0.0

        def on_step_end(self, *_args, **_kwargs):
            steps.append(
                {"step_s": time.perf_counter() - self.start, "phase/gen+reward": self.gen_s}
            )

        def on_log(self, _args, _state, _control, logs=None, **_kwargs):
            if logs and "num_tokens" in logs and steps:
                steps[-1]["num_tokens_total"] = float(logs["num_tokens"])
                for key in ("reward", "rewards/reward/mean"):
                    if key in logs:
                        steps[-1]["reward"] = float(logs[key])

    timer = StepTimer()
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    trainer = GRPOTrainer(
        model=args.model_path,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    original = trainer._generate_and_score_completions

    def timed_generate(*a, **k):
        start = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            timer.gen_s += time.perf_counter() - start

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    previous = 0.0
    for step in steps:
        total = step.pop("num_tokens_total", previous)
        step["tokens"], previous = total - previous, total
        step["phase/train"] = step["step_s"] - step["phase/gen+reward"]
    Path(args.result).write_text(json.dumps({"steps": steps}))


# ---- driver -------------------------------------------------------------------------------------
def _run(cmd: list[str], env: dict[str, str], log: Path) -> None:
    print(f"$ {' '.join(cmd[:4])} ...  (log: {log})", flush=True)
    with open(log, "w") as handle:
        code = subprocess.call(cmd, env=env, stdout=handle, stderr=subprocess.STDOUT)
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise SystemExit(f"command failed with exit code {code}; last lines of {log}:\n{tail}")


def report(name: str, run: dict, warmup: int) -> dict[str, float]:
    stats = summarise(run["steps"], warmup)
    stats["wall_s"] = run["wall_s"]
    phases = ", ".join(
        f"{k.removeprefix('median_phase/')} {v:.2f}"
        for k, v in stats.items()
        if k.startswith("median_phase/")
    )
    rewards = [s.get("reward") for s in run["steps"]]
    print(
        f"{name:7s} median {stats['median_step_s']:7.2f} s/step"
        f" | {stats['tokens_per_s']:8.1f} tok/s"
        f" | {stats['tokens_per_step']:7.0f} tok/step | run {stats['wall_s']:6.1f} s"
        f" | phases (median s): {phases}"
    )
    print(f"        reward per step: {[round(r, 3) if r is not None else None for r in rewards]}")
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2, or a model path/spec")
    parser.add_argument("--data", default=None, help="polyrl data spec (default: per model)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of medians")
    parser.add_argument("--batch", type=int, default=4, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=0,
        help="rows per forward/backward on both sides (default 0: all rows of the step at once)",
    )
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--max-prompt-length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument(
        "--dtype",
        choices=("bf16", "fp32"),
        default=None,
        help="bf16: fp32 master weights + bf16 compute on both sides "
        "(default: fp32 for tiny, bf16 otherwise)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: one GPU for TRL, --workers GPUs for polyrl (keep 1 for a like-for-like run)",
    )
    parser.add_argument("--workers", type=int, default=1, help="polyrl workers (CPU or GPU)")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads of the TRL process (polyrl gives each worker cpu_count / workers)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=("polyrl", "trl"), default=None)
    parser.add_argument("--polyrl-python", default=sys.executable)
    parser.add_argument(
        "--trl-python",
        default=None,
        help=f"Python of the environment with TRL (default: ${TRL_PYTHON_ENV}, else this Python "
        "if it imports trl)",
    )
    parser.add_argument("--work-dir", default=None, help="where logs and runs go (default: tmp)")
    parser.add_argument("--json", default=None, help="write the summary here")
    # the TRL child's own arguments
    parser.add_argument("--child-trl", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    parser.add_argument("--train-parquet", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child_trl:
        trl_child(args)
        return 0

    from polyrl.data.sources import resolve_data_files
    from polyrl.models.resolve import resolve_model_path

    if args.only in (None, "trl"):  # fail before the polyrl side's minutes, not after
        args.trl_python = resolve_trl_python(args.trl_python)
    rows = args.batch * args.n
    if args.micro_batch and (args.micro_batch < 0 or rows % args.micro_batch):
        raise SystemExit(
            f"bench_vs_trl: --micro-batch {args.micro_batch} must divide the step's "
            f"{rows} rows (--batch x --n)"
        )
    if args.dtype is None:
        args.dtype = "fp32" if args.model == "tiny" else "bf16"
    model = resolve_model_path(MODELS.get(args.model, args.model))
    data_spec = args.data or DATA.get(args.model, DATA["smollm2"])
    train = resolve_data_files(data_spec, "train")[0]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="polyrl-vs-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    print(
        f"model {model}\ndata {train}\n{args.steps} steps x {args.batch} prompts x {args.n} "
        f"samples, <= {args.response_length} response tokens, {args.dtype}, "
        f"polyrl workers {args.workers}, TRL threads {args.threads}; load average {load:.1f}",
        flush=True,
    )
    results: dict[str, dict] = {}
    if args.only in (None, "polyrl"):
        results["polyrl"] = run_polyrl(args, model, train, work)
    if args.only in (None, "trl"):
        results["trl"] = run_trl(args, model, train, work)
    print(
        f"\n== summary (median over steps {args.warmup + 1}..{args.steps}; load average "
        f"{load:.1f} before, {os.getloadavg()[0]:.1f} after)"
    )
    summary = {name: report(name, run, args.warmup) for name, run in results.items()}
    if len(summary) == 2:
        p, t = summary["polyrl"], summary["trl"]
        print(
            f"ratio polyrl/TRL: time per step {p['median_step_s'] / t['median_step_s']:.2f}x, "
            f"tokens/s {p['tokens_per_s'] / t['tokens_per_s']:.2f}x "
            f"(>1 tokens/s: polyrl faster)"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "summary": summary, "runs": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
