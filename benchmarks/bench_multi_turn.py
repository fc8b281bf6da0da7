"""Multi-turn rollout throughput against single-turn generation of the same tokens.

Both sides run the ``hf`` rollout engine on one model object in one process:

* ``single``: each prompt answered in one turn of ``turns x tokens_per_turn`` new tokens;
* ``multi``: the same prompts as episodes of ``turns`` assistant turns of ``tokens_per_turn``
  tokens, each followed by an observation of ``observation_words`` words (a user message), run by
  polyrl's multi-turn rollout (:class:`polyrl.envs.rollout.MultiTurnRollout`): all live episodes
  sampled together at each turn, every turn a fresh ``generate`` call over the whole context
  (prompt, earlier turns, observations), the environment answered between turns.

tokens/s counts assistant tokens only (what the policy generated); episodes/s is episodes per
second of the multi-turn side. ratio = multi tokens/s / single tokens/s: the price of splitting a
response into turns (re-reading the context each turn, the observations, the environment calls).
Random weights rarely stop early, so every turn runs to its cap and both sides generate the same
count. Each figure is the median of ``--runs`` timed runs after ``--warmup`` untimed ones.

Where the time goes: one more run of each side after the timed ones (``--profile``, on by
default), with the engine waiting for the device around its prefills and graph captures, prints
per ``generate`` call (a turn) the rows, the context width, the tokens prefilled (padding
included) and those the prefix cache reused, and the seconds of prefill, graph capture, decode
(the rest of the call) and host (from the call's end to the next call: the environment, the
tokenizer, building the next turn's prompts).

Usage::

    python benchmarks/bench_multi_turn.py --model tiny --episodes 16 --threads 2       # CPU
    python benchmarks/bench_multi_turn.py --device cuda --model qwen2-0.5b-random \\
        --episodes 256 --turns 4 --tokens-per-turn 128 --prompt-len 64 --micro-batch-size 256

The figures depend on the machine and what else runs on it: quote them with the settings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_rollout_hf import encode_prompts, model_folder

from polyrl.envs.episode import (
    AssistantTurn,
    Environment,
    Episode,
    EpisodeStart,
    Observation,
)


class FixedTurnsEpisode(Episode):
    """Answers every assistant turn with the same user message until ``turns`` turns were made."""

    def __init__(self, turns: int, words: int) -> None:
        self.turns, self.text = turns, " ".join(["next"] * words)

    async def start(self) -> EpisodeStart:
        return EpisodeStart(messages=None)  # the prompt's tokens as encoded

    async def step(self, turn: AssistantTurn) -> Observation:
        if turn.index + 1 >= self.turns:
            return Observation(done=True, reward=1.0)
        return Observation([{"role": "user", "content": self.text}])


class TimedGenerate:
    """The engine's ``generate``, each call's span and the engine's own counters recorded."""

    def __init__(self, engine: Any, sync: Any) -> None:
        self.engine, self.sync = engine, sync
        self.calls: list[dict[str, Any]] = []

    def __call__(self, batch: Any, params: Any) -> Any:
        stats = getattr(self.engine, "stats", {})  # an engine from before the counters: none
        before = dict(stats)
        self.sync()
        start = time.perf_counter()
        out = self.engine.generate(batch, params)
        self.sync()
        end = time.perf_counter()
        spent = {key: value - before.get(key, 0) for key, value in stats.items()}
        self.calls.append(
            {
                "rows": int(batch["input_ids"].shape[0]),
                "width": int(batch["attention_mask"].sum(1).max()),
                "new_tokens": int(out["response_mask"].sum()),
                "start": start,
                "end": end,
                **spent,
            }
        )
        return out

    def breakdown(self, finished: float) -> list[dict[str, Any]]:
        """One row per call: its phases' seconds, host time up to the next call (or the end)."""
        turns = []
        for index, call in enumerate(self.calls):
            following = self.calls[index + 1]["start"] if index + 1 < len(self.calls) else finished
            generate_s = call["end"] - call["start"]
            prefill_s, capture_s = call.get("prefill_s", 0.0), call.get("capture_s", 0.0)
            turns.append(
                {
                    "turn": index,
                    "rows": call["rows"],
                    "context": call["width"],
                    "new_tokens": call["new_tokens"],
                    "prefilled_tokens": int(call.get("prefill_tokens", 0)),
                    "reused_tokens": int(call.get("prefix_tokens_reused", 0)),
                    "generate_s": generate_s,
                    "prefill_s": prefill_s,
                    "capture_s": capture_s,
                    "decode_s": generate_s - prefill_s - capture_s,
                    "host_s": following - call["end"],
                }
            )
        return turns


@contextlib.contextmanager
def torch_profile(top: int, cuda: bool, label: str) -> Iterator[None]:
    """Inside the block, torch.profiler records; on exit its ``top`` operators by self time."""
    if not top:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield
    averages = prof.key_averages()
    for sort in (["self_cuda_time_total"] if cuda else []) + ["self_cpu_time_total"]:
        print(f"{label}: operators by {sort}")
        print(averages.table(sort_by=sort, row_limit=top, max_name_column_width=60))


def print_breakdown(label: str, turns: list[dict[str, Any]]) -> None:
    print(f"{label}: per generate call (a profiled run: the engine waits for the device)")
    print(
        f"{'turn':>5}{'rows':>6}{'context':>9}{'new tok':>9}{'prefilled':>11}{'reused':>9}"
        f"{'prefill s':>11}{'capture s':>11}{'decode s':>10}{'host s':>9}"
    )
    for t in turns:
        print(
            f"{t['turn']:>5}{t['rows']:>6}{t['context']:>9}{t['new_tokens']:>9}"
            f"{t['prefilled_tokens']:>11}{t['reused_tokens']:>9}{t['prefill_s']:>11.3f}"
            f"{t['capture_s']:>11.3f}{t['decode_s']:>10.3f}{t['host_s']:>9.3f}"
        )
    total = {key: sum(t[key] for t in turns) for key in ("prefill_s", "capture_s", "decode_s")}
    total["host_s"] = sum(t["host_s"] for t in turns)
    print("  total: " + ", ".join(f"{key} {value:.3f}" for key, value in total.items()))


class FixedTurnsEnvironment(Environment):
    def __init__(self, turns: int, words: int) -> None:
        self.turns, self.words = turns, words

    def episode(self, row: Mapping[str, Any]) -> Episode:
        return FixedTurnsEpisode(self.turns, self.words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens-per-turn", type=int, default=32)
    parser.add_argument("--observation-words", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, default=256)
    parser.add_argument("--static-cache", default="auto", help="the hf engine's static_cache")
    parser.add_argument(
        "--prefix-cache",
        default="true",
        help="the hf engine's prefix_cache (a multi-turn run's default, auto, turns it on)",
    )
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false", help="skip the breakdown run"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument(
        "--torch-profile",
        type=int,
        default=0,
        help="print the N operators of most self time (device, then host) of the profiled runs",
    )
    args = parser.parse_args()

    import torch
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from polyrl.envs.chat import ChatTokens
    from polyrl.envs.rollout import MultiTurnRollout
    from polyrl.envs.settings import MultiTurnSettings
    from polyrl.interfaces import RolloutContext, SamplingParams
    from polyrl_rollout_hf.engine import HFRolloutEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    workdir = tempfile.mkdtemp(prefix="polyrl-bench-mt-")
    folder = model_folder(args.model, workdir)
    prompts, pad, eos = encode_prompts(folder, args.episodes, args.prompt_len)
    total = args.turns * args.tokens_per_turn
    engine = HFRolloutEngine(
        RolloutContext(
            model_path=folder,
            config={
                "dtype": dtype,
                "micro_batch_size": args.micro_batch_size,
                "engine_kwargs": {
                    "hf": {"static_cache": args.static_cache, "prefix_cache": args.prefix_cache}
                },
            },
            device=args.device,
            rank=0,
            world_size=1,
            pad_token_id=pad,
            eos_token_ids=eos,
        )
    )
    settings = OmegaConf.structured(
        MultiTurnSettings(
            enable=True, max_assistant_turns=args.turns, max_tokens_per_turn=args.tokens_per_turn
        )
    )
    chat = ChatTokens(AutoTokenizer.from_pretrained(folder), eos)
    environment = FixedTurnsEnvironment(args.turns, args.observation_words)
    # room for every turn and observation, so that no turn is cut short of the single side's count
    observation = [{"role": "user", "content": FixedTurnsEpisode(1, args.observation_words).text}]
    budget = total + args.turns * len(chat.observation_ids(observation, close=True))
    rollout = MultiTurnRollout(
        environment,
        chat,
        settings,
        max_response_length=budget,
        max_prompt_length=args.prompt_len,
    )
    prompt_ids = [
        row[mask.bool()].tolist()
        for row, mask in zip(prompts["input_ids"], prompts["attention_mask"])
    ]
    rows = [{"index": i} for i in range(args.episodes)]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    generate = TimedGenerate(engine, sync)

    def single() -> int:
        params = SamplingParams(n=1, max_new_tokens=total, temperature=1.0, seed=0)
        return int(generate(prompts, params)["response_mask"].sum())

    def multi() -> int:
        params = SamplingParams(n=1, max_new_tokens=total, temperature=1.0, seed=0)
        # the kept KV released after the last turn, as the gen stage does (older code: no such call)
        release = getattr(engine, "reset_prefix_cache", None)
        extra = {} if release is None else {"release": release}
        trajectories, _ = rollout.run(rows, prompt_ids, generate, params, **extra)
        return sum(sum(t.assistant) for t in trajectories)

    results: dict[str, Any] = {}
    for label, fn in (("single", single), ("multi", multi)):
        times, tokens = [], 0
        for run in range(args.warmup + args.runs + int(args.profile)):
            profiled = run == args.warmup + args.runs
            engine.timing_sync = profiled
            generate.calls.clear()
            sync()
            start = time.perf_counter()
            with torch_profile(args.torch_profile if profiled else 0, cuda, label):
                tokens = fn()
                sync()
                finished = time.perf_counter()  # before the profiler writes its tables
            if profiled:
                results[f"{label}_turns"] = generate.breakdown(finished)
            elif run >= args.warmup:
                times.append(finished - start)
        seconds = statistics.median(times)
        results[label] = {
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            "runs_s": times,
        }
    results["multi"]["episodes_per_s"] = args.episodes / results["multi"]["seconds"]
    ratio = results["multi"]["tokens_per_s"] / results["single"]["tokens_per_s"]
    print(
        f"model {args.model} on {args.device} ({dtype}), {args.episodes} episodes x "
        f"{args.turns} turns x {args.tokens_per_turn} tokens, observations of "
        f"{args.observation_words} words, prompt {args.prompt_len} tokens"
    )
    print(f"{'side':8}{'tokens':>10}{'median s':>11}{'tokens/s':>12}{'episodes/s':>12}")
    for label in ("single", "multi"):
        row = results[label]
        episodes = f"{row['episodes_per_s']:12.2f}" if "episodes_per_s" in row else " " * 12
        print(
            f"{label:8}{row['tokens']:>10}{row['seconds']:>11.3f}{row['tokens_per_s']:>12.0f}"
            f"{episodes}"
        )
    print(f"ratio multi/single tokens/s: {ratio:.2f}")
    for label in ("single", "multi"):
        if f"{label}_turns" in results:
            print_breakdown(label, results[f"{label}_turns"])
    if args.out:
        Path(args.out).write_text(
            json.dumps({"args": vars(args), "results": results, "ratio": ratio})
        )


if __name__ == "__main__":
    main()
