"""The prompt loader (deterministic order, exact resume), built-in sources and generators, and the
``polyrl data`` command."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from polyrl.data.loader import PromptLoader
from polyrl.data.sources import builtin_dir, parse_builtin, resolve_data_files
from polyrl.errors import DataError


@dataclass
class _Item:
    input_ids: list[int]
    index: int
    data_source: str = "polyrl/tiny_digits"
    ground_truth: str = "1"
    extra_info: dict | None = None
    raw_prompt: str = ""
    messages: list | None = None


class _Dataset:
    """Ten prompts; prompt i is [i+10] * (i % 3 + 1) tokens."""

    pad_token_id = 0

    def __init__(self, size: int = 10) -> None:
        self.items = [_Item([i + 10] * (i % 3 + 1), i, extra_info={}) for i in range(size)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> _Item:
        return self.items[i]


# ---- loader ---------------------------------------------------------------------------------
def test_loader_epochs_cover_the_dataset_and_are_deterministic():
    loader = PromptLoader(_Dataset(), 3, shuffle=True, seed=5)
    assert len(loader) == 3  # 10 // 3, the tail is dropped
    epoch0 = [loader.next_indices() for _ in range(3)]
    flat = [i for batch in epoch0 for i in batch]
    assert len(set(flat)) == 9 and loader.epoch == 0
    first_of_epoch1 = loader.next_indices()
    assert loader.epoch == 1
    # The order of an epoch is a function of (seed, epoch) only.
    expected = np.random.default_rng([5, 0]).permutation(10)[:9].tolist()
    assert flat == expected
    assert first_of_epoch1 == np.random.default_rng([5, 1]).permutation(10)[:3].tolist()
    same = PromptLoader(_Dataset(), 3, shuffle=True, seed=5)
    assert [same.next_indices() for _ in range(3)] == epoch0
    other_seed = PromptLoader(_Dataset(), 3, shuffle=True, seed=6)
    assert [other_seed.next_indices() for _ in range(3)] != epoch0


def test_loader_without_shuffle_and_without_drop_last():
    loader = PromptLoader(_Dataset(), 4, shuffle=False, drop_last=False)
    assert len(loader) == 3
    assert [loader.next_indices() for _ in range(4)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9],
        [0, 1, 2, 3],
    ]


def test_loader_resume_sees_exactly_the_same_batches():
    straight = PromptLoader(_Dataset(), 3, shuffle=True, seed=2)
    reference = [straight.next_indices() for _ in range(8)]

    first = PromptLoader(_Dataset(), 3, shuffle=True, seed=2)
    seen = [first.next_indices() for _ in range(4)]
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    resumed = PromptLoader(_Dataset(), 3, shuffle=True, seed=2)
    resumed.load_state_dict(state)
    seen += [resumed.next_indices() for _ in range(4)]
    assert seen == reference
    assert resumed.epoch == straight.epoch

    with pytest.raises(DataError, match="saved with 10 prompts, the dataset now has 9"):
        PromptLoader(_Dataset(9), 3).load_state_dict(state)


def test_loader_batches_are_collated():
    loader = PromptLoader(_Dataset(), 2, shuffle=False)
    batch = loader.next_batch()
    assert batch["input_ids"].tolist() == [[0, 10], [11, 11]]
    assert batch["attention_mask"].tolist() == [[0, 1], [1, 1]]
    assert list(batch["index"]) == [0, 1]


def test_batch_larger_than_dataset_is_a_clear_error():
    with pytest.raises(DataError, match=r"train_batch_size=16 is larger than the dataset \(10"):
        PromptLoader(_Dataset(), 16)


# ---- sources --------------------------------------------------------------------------------
def test_plain_paths_pass_through_and_missing_ones_fail(tmp_path: Path):
    real = tmp_path / "train.parquet"
    real.write_bytes(b"x")
    assert resolve_data_files(str(real), "train") == [str(real)]
    assert resolve_data_files([str(real), str(real)], "train") == [str(real)] * 2
    with pytest.raises(DataError, match=r"missing\.parquet' does not exist"):
        resolve_data_files([str(real), str(tmp_path / "missing.parquet")], "val")
    with pytest.raises(DataError, match="no val data given"):
        resolve_data_files(None, "val")


def test_parse_builtin_keeps_plus_and_reads_json():
    name, task, params = parse_builtin(
        'builtin:reasoning_gym/basic_arithmetic?train_size=8&operators=["+","-"]&x=abc'
    )
    assert (name, task) == ("reasoning_gym", "basic_arithmetic")
    assert params == {"train_size": 8, "operators": ["+", "-"], "x": "abc"}
    with pytest.raises(DataError, match="key=value"):
        parse_builtin("builtin:tiny_digits?oops")


def test_builtin_tiny_digits_is_generated_once_and_cached(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("POLYRL_CACHE_DIR", str(tmp_path / "cache"))
    spec = "builtin:tiny_digits?train_size=12&val_size=4&seed=3"
    (train,) = resolve_data_files(spec, "train")
    (val,) = resolve_data_files(spec, "val")
    folder = builtin_dir(spec)
    assert Path(train) == folder / "train.parquet" and Path(val) == folder / "val.parquet"
    assert str(folder).startswith(str(tmp_path / "cache" / "data"))
    rows = pq.read_table(train).to_pylist()
    assert len(rows) == 12 and pq.read_table(val).num_rows == 4
    assert all(r["data_source"] == "polyrl/tiny_digits" for r in rows)
    assert all(r["reward_model"]["ground_truth"] in r["prompt"][0]["content"] for r in rows)
    # Cached: a second resolve does not write again.
    mtime = os.stat(train).st_mtime_ns
    assert resolve_data_files(spec, "train") == [train]
    assert os.stat(train).st_mtime_ns == mtime
    # No temporary folders are left behind.
    assert [p.name for p in (tmp_path / "cache" / "data").iterdir()] == [folder.name]
    # Other options, other folder.
    assert builtin_dir("builtin:tiny_digits?train_size=13") != folder
    with pytest.raises(DataError, match="unknown option"):
        resolve_data_files("builtin:tiny_digits?colour=red", "train")
    with pytest.raises(DataError, match="unknown built-in dataset 'nope'"):
        resolve_data_files("builtin:nope", "train")


def test_builtin_reasoning_gym_rows_are_scorable(tmp_path: Path, monkeypatch):
    from polyrl.rewards.scorers import default_compute_score

    monkeypatch.setenv("POLYRL_CACHE_DIR", str(tmp_path))
    spec = "builtin:reasoning_gym/chain_sum?train_size=6&val_size=3&seed=4&min_terms=2&max_terms=2"
    (train,) = resolve_data_files(spec, "train")
    rows = pq.read_table(train).to_pylist()
    assert len(rows) == 6
    for row in rows:
        assert row["data_source"] == "reasoning_gym/chain_sum"
        entry = json.loads(row["extra_info"]["entry"])
        assert entry["metadata"]["num_terms"] == 2  # the task option reached the task config
        messages = row["prompt"]
        # fewshot: instruction, two solved examples of the same task, then the question.
        roles = ["system", "user", "assistant", "user", "assistant", "user"]
        assert [m["role"] for m in messages] == roles
        assert messages[2]["content"].startswith("<answer>")
        assert messages[-1]["content"] == entry["question"]
        truth = row["reward_model"]["ground_truth"]
        right = default_compute_score(
            row["data_source"], f"<answer>{truth}</answer>", truth, row["extra_info"]
        )
        wrong = default_compute_score(
            row["data_source"], "<answer>banana</answer>", truth, row["extra_info"]
        )
        assert (right, wrong) == (1.0, 0.0)
    (val,) = resolve_data_files(spec, "val")
    val_prompt = pq.read_table(val).to_pylist()[0]["prompt"]
    assert val_prompt[:-1] == rows[0]["prompt"][:-1]  # the same examples in both splits
    with pytest.raises(DataError, match="no task 'nonesuch'"):
        resolve_data_files("builtin:reasoning_gym/nonesuch", "train")
    with pytest.raises(DataError, match="rejected the settings"):
        resolve_data_files("builtin:reasoning_gym/chain_sum?min_terms=0", "train")


def test_builtin_reasoning_gym_validates_on_problems_it_did_not_train_on(tmp_path, monkeypatch):
    """reasoning-gym's dataset of seed s + 1 is seed s's shifted by one problem: a validation
    split seeded next to the training split's would be made of training problems."""
    import reasoning_gym

    shifted = reasoning_gym.create_dataset("basic_arithmetic", size=4, seed=8)
    again = reasoning_gym.create_dataset("basic_arithmetic", size=4, seed=7)
    assert [shifted[i]["question"] for i in range(3)] == [again[i]["question"] for i in (1, 2, 3)]

    monkeypatch.setenv("POLYRL_CACHE_DIR", str(tmp_path))
    spec = "builtin:reasoning_gym/basic_arithmetic?train_size=64&val_size=16&seed=7"
    questions = {
        split: {row["prompt"][-1]["content"] for row in pq.read_table(path).to_pylist()}
        for split in ("train", "val")
        for path in resolve_data_files(spec, split)
    }
    assert len(questions["val"]) == 16 and not questions["val"] & questions["train"]


# ---- the command ----------------------------------------------------------------------------
def test_polyrl_data_command_writes_files(tmp_path: Path, capsys: pytest.CaptureFixture):
    from polyrl.data.commands import add_subcommand

    parser = argparse.ArgumentParser(prog="polyrl")
    add_subcommand(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "data",
            "reasoning-gym",
            "--task",
            "basic_arithmetic",
            "--task-config",
            '{"min_terms": 2, "max_terms": 2, "operators": ["+"]}',
            "--train-size",
            "5",
            "--val-size",
            "2",
            "--out",
            str(tmp_path / "ba"),
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'ba' / 'train.parquet'} (5 rows)" in out
    rows = pq.read_table(tmp_path / "ba" / "val.parquet").to_pylist()
    assert len(rows) == 2 and all(
        "+" in json.loads(r["extra_info"]["entry"])["question"] for r in rows
    )

    args = parser.parse_args(["data", "tiny", "--train-size", "7", "--out", str(tmp_path / "t")])
    assert args.func(args) == 0
    assert pq.read_table(tmp_path / "t" / "train.parquet").num_rows == 7

    bad = parser.parse_args(
        ["data", "reasoning-gym", "--task", "chain_sum", "--task-config", "{oops", "--out", "x"]
    )
    with pytest.raises(DataError, match="--task-config is not valid JSON"):
        bad.func(bad)


def test_prompt_styles_and_several_examples():
    from polyrl.data.generate import ANSWER_FORMAT_SYSTEM, reasoning_gym_rows

    config = {"min_terms": 2, "max_terms": 2}
    rows = reasoning_gym_rows(
        "chain_sum", size=2, seed=1, split="val", task_config=config, num_examples=3
    )
    roles = [m["role"] for m in rows[0]["prompt"]]
    assert roles == ["system", *(["user", "assistant"] * 3), "user"]
    # The examples are the same for every row and differ from the row's own problem.
    assert rows[0]["prompt"][:7] == rows[1]["prompt"][:7]
    assert rows[0]["prompt"][1]["content"] != rows[0]["prompt"][7]["content"]
    plain = reasoning_gym_rows("chain_sum", size=1, seed=1, split="val", prompt_style="plain")
    assert [m["role"] for m in plain[0]["prompt"]] == ["user"]
    system = reasoning_gym_rows("chain_sum", size=1, seed=1, split="val", prompt_style="system")
    assert system[0]["prompt"][0] == {"role": "system", "content": ANSWER_FORMAT_SYSTEM}
    with pytest.raises(DataError, match="prompt style 'chatty'"):
        reasoning_gym_rows("chain_sum", size=1, seed=1, split="val", prompt_style="chatty")
