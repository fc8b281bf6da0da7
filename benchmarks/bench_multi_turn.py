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

Usage::

    python benchmarks/bench_multi_turn.py --model tiny --episodes 16 --threads 2       # CPU
    python benchmarks/bench_multi_turn.py --device cuda --model qwen2-0.5b-random \\
        --episodes 256 --turns 4 --tokens-per-turn 128 --prompt-len 64 --micro-batch-size 256

The figures depend on the machine and what else runs on it: quote them with the settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
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
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
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
                "engine_kwargs": {"hf": {"static_cache": args.static_cache}},
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
    budget = total + args.turns * (args.observation_words + 16)
    rollout = MultiTurnRollout(
        FixedTurnsEnvironment(args.turns, args.observation_words),
        ChatTokens(AutoTokenizer.from_pretrained(folder), eos),
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

    def single() -> int:
        params = SamplingParams(n=1, max_new_tokens=total, temperature=1.0, seed=0)
        return int(engine.generate(prompts, params)["response_mask"].sum())

    def multi() -> int:
        params = SamplingParams(n=1, max_new_tokens=total, temperature=1.0, seed=0)
        trajectories, _ = rollout.run(rows, prompt_ids, engine.generate, params)
        return sum(sum(t.assistant) for t in trajectories)

    results = {}
    for label, fn in (("single", single), ("multi", multi)):
        times, tokens = [], 0
        for run in range(args.warmup + args.runs):
            sync()
            start = time.perf_counter()
            tokens = fn()
            sync()
            if run >= args.warmup:
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        results[label] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
    results["multi"]["episodes_per_s"] = args.episodes / results["multi"]["seconds"]
    ratio = results["multi"]["tokens_per_s"] / results["single"]["tokens_per_s"]
    print(
        f"model {args.model} on {args.device} ({dtype}), {args.episodes} episodes x "
        f"{args.turns} turns x {args.tokens_per_turn} tokens, observations of "
        f"{args.observation_words} words, prompt {args.prompt_len} tokens"
    )
    print(f"{'side':8}{'tokens':>10}{'median s':>11}{'tokens/s':>12}{'episodes/s':>12}")
    for label, row in results.items():
        episodes = f"{row['episodes_per_s']:12.2f}" if "episodes_per_s" in row else " " * 12
        print(
            f"{label:8}{row['tokens']:>10}{row['seconds']:>11.3f}{row['tokens_per_s']:>12.0f}"
            f"{episodes}"
        )
    print(f"ratio multi/single tokens/s: {ratio:.2f}")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"args": vars(args), "results": results, "ratio": ratio})
        )


if __name__ == "__main__":
    main()
