"""The game rows' files: their layout, their seeds, and that a row plays the game it names."""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from polyrl.api import AssistantTurn, RewardError, read_parquet
from polyrl_env_textarena.data import main, write_games
from polyrl_env_textarena.scorer import refuse


def test_files_name_the_game_and_distinct_seeds(tmp_path):
    paths = write_games(tmp_path, "GuessTheNumber-v0-hardcore", train_size=6, val_size=3, seed=1)
    train = read_parquet(str(paths["train"]), "data").to_pylist()
    val = read_parquet(str(paths["val"]), "data").to_pylist()
    assert [len(train), len(val)] == [6, 3]
    row = train[0]
    assert row["data_source"] == "textarena"
    assert row["prompt"] == [{"role": "user", "content": "Play GuessTheNumber-v0-hardcore."}]
    assert row["reward_model"] == {"style": "game", "ground_truth": ""}
    extras = [r["extra_info"] for r in train + val]
    assert {e["env_id"] for e in extras} == {"GuessTheNumber-v0-hardcore"}
    assert [e["index"] for e in extras] == [0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert [e["split"] for e in extras] == ["train"] * 6 + ["val"] * 3
    assert len({e["seed"] for e in extras}) == 9  # no validation game is a training game
    again = write_games(
        tmp_path / "again", "GuessTheNumber-v0-hardcore", train_size=6, val_size=3, seed=1
    )
    assert read_parquet(str(again["train"]), "data").to_pylist() == train


def test_a_written_row_plays_its_seed(tmp_path, env):
    main([str(tmp_path), "--train-size", "2", "--val-size", "1", "--seed", "3"])
    row = read_parquet(str(tmp_path / "train.parquet"), "data").to_pylist()[1]
    seed = row["extra_info"]["seed"]

    async def drive():
        episode = env.episode({"index": 1, "extra_info": row["extra_info"]})
        await episode.start()
        guess = random.Random(seed).randint(1, 20)  # the game's target for this seed
        obs = await episode.step(AssistantTurn(0, f"[{guess}]", (1,)))
        return obs, await episode.finish("done")

    obs, result = asyncio.run(drive())
    assert obs.done and result.reward == 1.0


def test_scoring_game_rows_outside_the_environment_names_the_fix():
    with pytest.raises(RewardError, match=re.escape("multi_turn.environment=textarena")):
        refuse("textarena", "[5]", "", {}, {})
