"""Rows that name TextArena games, as verl-format parquet files.

Any dataset's rows already serve as games (the episode replaces the prompt with the game's and
derives a seed from the row), so ``data.train_files=builtin:tiny_digits`` trains without files.
These files are for choosing the game and the seeds. Layout (one row per game)::

    data_source   "textarena"                      (scored by the game: see scorer.py)
    prompt        [{"role": "user", "content": "Play GuessTheNumber-v0."}]   (replaced)
    ability       "game"
    reward_model  {"style": "game", "ground_truth": ""}
    extra_info    {"env_id": "GuessTheNumber-v0", "seed": 7, "split": "train", "index": 0}

Train and val seeds come from one ``random.Random(seed)`` stream without repeats, so no
validation game is a training game. Write them with
``python -m polyrl_env_textarena.data OUT_DIR --env-id GuessTheNumber-v0``.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

DATA_SOURCE = "textarena"
SEED_RANGE = 2**31  # TextArena passes seeds to random.seed: any int works


def game_rows(env_id: str, seeds: list[int], split: str) -> list[dict[str, Any]]:
    """One row per seed, in the layout above."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"Play {env_id}."}],
            "ability": "game",
            "reward_model": {"style": "game", "ground_truth": ""},
            "extra_info": {"env_id": env_id, "seed": seed, "split": split, "index": index},
        }
        for index, seed in enumerate(seeds)
    ]


def write_games(
    out_dir: str | Path,
    env_id: str = "GuessTheNumber-v0",
    *,
    train_size: int = 256,
    val_size: int = 32,
    seed: int = 0,
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of ``env_id`` games into ``out_dir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    seeds = random.Random(seed).sample(range(SEED_RANGE), train_size + val_size)
    splits = {"train": seeds[:train_size], "val": seeds[train_size:]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, split_seeds in splits.items():
        paths[split] = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(game_rows(env_id, split_seeds, split)), paths[split])
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--env-id", default="GuessTheNumber-v0")
    parser.add_argument("--train-size", type=int, default=256)
    parser.add_argument("--val-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = write_games(
        args.out_dir,
        args.env_id,
        train_size=args.train_size,
        val_size=args.val_size,
        seed=args.seed,
    )
    for split, path in paths.items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
