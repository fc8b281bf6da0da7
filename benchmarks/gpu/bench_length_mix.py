"""Useful tokens/s of the ``hf`` rollout on a length mix: continuous batching against today's
chunked static path, side by side in one process (issue 25, deliverable 2).

The model is a random one whose responses end at random (``make_random_model.set_eos_rate``: each
sampled token ends the response with probability ``--eos-rate``; lengths are geometric, cut at
``--max-new-tokens``). ``--prompts`` x ``--n`` samples go through ``--slots`` decode slots
(``micro_batch_size``): the static path decodes chunks of that many rows, each until its longest
row ends; the continuous path refills a slot as soon as its row ends. Useful tokens are response
tokens up to and including the stop token. Both paths run on the same engine (one model, the
same CUDA graphs' weights), alternating, after ``--warmup`` untimed runs each; figures are
medians of ``--runs``.

    # CPU (a small shape: hidden 256, 4 layers, vocabulary 8192)
    python benchmarks/gpu/bench_length_mix.py --shape cpu-small --prompts 128 --n 8 --slots 256 \\
        --max-new-tokens 128 --threads 2
    # H200
    python benchmarks/gpu/bench_length_mix.py --shape qwen2-0.5b --device cuda --prompts 128 \\
        --n 8 --slots 256 --max-new-tokens 256 --prompt-len 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_random_model import set_eos_rate

# A shape for 2 CPU cores: the decode step's work grows with its rows, as on a GPU at scale.
CPU_SMALL = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 8192,
}


def build_model(shape: str, folder: str, dtype: str, device: str) -> str:
    from polyrl.models.shapes import build_random_model, random_model_config

    if shape != "cpu-small":
        device = "cuda" if device.startswith("cuda") else "cpu"
        return build_random_model(folder, shape, dtype=dtype, device=device)
    import torch
    from transformers import Qwen2ForCausalLM

    from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID

    config = random_model_config(
        "tiny", eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID, **CPU_SMALL
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    Path(folder, "polyrl_random.json").write_text(json.dumps({"parameters": params}))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="cpu-small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--eos-rate", type=float, default=None, help="default 1.5 / max-new")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--source", default=None, help="import polyrl_rollout_hf from here")
    parser.add_argument("--hf", type=json.loads, default={}, help="more engine_kwargs.hf, as JSON")
    parser.add_argument("--label", default=None, help="names this code path in the JSON")
    args = parser.parse_args()
    if args.source:  # e.g. an export of an older commit: the baseline, in its own process
        sys.path.insert(0, str(Path(args.source).resolve()))

    import torch

    from polyrl.batch import Batch
    from polyrl.interfaces import RolloutContext, SamplingParams
    from polyrl_rollout_hf.engine import HFRolloutEngine

    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    rate = args.eos_rate if args.eos_rate is not None else 1.5 / args.max_new_tokens
    with tempfile.TemporaryDirectory() as folder:
        build_model(args.shape, folder, args.dtype, args.device)
        eos = set_eos_rate(folder, rate)
        config = json.loads(Path(folder, "config.json").read_text())
        ctx = RolloutContext(
            model_path=folder,
            config={
                "dtype": args.dtype,
                "micro_batch_size": args.slots,
                "gpu_memory_utilization": 0.9,
                "engine_kwargs": {
                    "hf": {"static_cache": "true", "continuous_batching": "true", **args.hf}
                },
            },
            device=args.device,
            rank=0,
            world_size=1,
            pad_token_id=int(config.get("pad_token_id") or 0),
            eos_token_ids=eos,
        )
        engine = HFRolloutEngine(ctx)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 400, (args.prompts, args.prompt_len), generator=generator)
    prompts = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    params = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, seed=0)

    def run(continuous: bool) -> tuple[float, torch.Tensor]:
        engine.continuous = continuous
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, out["response_mask"].sum(1)

    paths = {"static (chunks)": False, "continuous": True}
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    tokens: dict[str, list[int]] = {name: [] for name in paths}
    lengths = None
    for name, continuous in paths.items():
        first = time.perf_counter()
        for _ in range(args.warmup):
            run(continuous)
        print(f"  warm-up {name}: {time.perf_counter() - first:.1f} s", flush=True)
    for _ in range(args.runs):
        for name, continuous in paths.items():
            elapsed, lengths = run(continuous)
            seconds[name].append(elapsed)
            tokens[name].append(int(lengths.sum()))
    rows = args.prompts * args.n
    quartiles = torch.quantile(lengths.float(), torch.tensor([0.25, 0.5, 0.75])).tolist()
    at_limit = float((lengths == args.max_new_tokens).float().mean())
    print(
        f"\n{args.shape} ({config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
        f"vocabulary {config['vocab_size']}), {args.dtype}, {args.device}"
        + (f" ({torch.cuda.get_device_name()})" if cuda else f", {args.threads} threads")
        + f", torch {torch.__version__}"
    )
    print(
        f"{rows} samples ({args.prompts} prompts x n={args.n}) through {args.slots} slots, prompt "
        f"{args.prompt_len} tokens, up to {args.max_new_tokens} new; EOS rate {rate:.4f}: "
        f"lengths quartiles {quartiles[0]:.0f}/{quartiles[1]:.0f}/{quartiles[2]:.0f}, "
        f"mean {float(lengths.float().mean()):.1f}, {100 * at_limit:.0f}% at the limit"
    )
    print(f"\n  {'path':<16} {'useful tok/s':>12}  {'median s':>8}  runs s")
    result = {
        "args": vars(args),
        "eos_rate": rate,
        "paths": {},
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }
    for name in paths:
        median = statistics.median(seconds[name])
        rate_tps = statistics.median(t / s for t, s in zip(tokens[name], seconds[name]))
        result["paths"][name] = {
            "tokens_per_s": rate_tps,
            "median_s": median,
            "runs_s": seconds[name],
        }
        runs = " ".join(f"{s:.3f}" for s in seconds[name])
        print(f"  {name:<16} {rate_tps:12.1f}  {median:8.3f}  {runs}")
    ratio = (
        result["paths"]["continuous"]["tokens_per_s"]
        / result["paths"]["static (chunks)"]["tokens_per_s"]
    )
    result["ratio"] = ratio
    print(f"  continuous / static: {ratio:.2f}x useful tokens/s")
    if cuda:
        print(f"  CUDA graph captures: {engine.static_decode.captures}")
    if args.json:
        with open(args.json, "a") as handle:  # one line per process: baseline and current
            handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
