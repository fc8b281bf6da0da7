"""verl-format parquet reading: accepted files, chat template, over-long prompts, clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from polyrl.data.dataset import RLDataset, collate
from polyrl.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from polyrl.models.tiny import build_tiny_model

    folder = build_tiny_model(str(tmp_path_factory.mktemp("tiny_model")))
    return AutoTokenizer.from_pretrained(folder)


def _row(i: int, question: str = "What is 2 + 3?") -> dict[str, Any]:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": question},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"split": "train", "index": i},
    }


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _cfg(**overrides: Any) -> dict[str, Any]:
    cfg = {
        "prompt_key": "prompt",
        "max_prompt_length": 64,
        "filter_overlong_prompts": True,
        "truncation": "error",
        "apply_chat_template": True,
    }
    cfg.update(overrides)
    return cfg


def test_verl_format_file_written_with_plain_pyarrow_is_accepted(tmp_path: Path, tokenizer: Any):
    # Built column by column with an explicit schema, as verl's preprocess scripts (via
    # datasets/pandas) produce: list<struct<content, role>>, struct reward_model and extra_info.
    message = pa.struct([("content", pa.string()), ("role", pa.string())])
    table = pa.table(
        {
            "data_source": pa.array(["openai/gsm8k", "openai/gsm8k"]),
            "prompt": pa.array(
                [
                    [{"content": "What is 1 + 1?", "role": "user"}],
                    [
                        {"content": "Be brief.", "role": "system"},
                        {"content": "2*3?", "role": "user"},
                    ],
                ],
                type=pa.list_(message),
            ),
            "ability": pa.array(["math", "math"]),
            "reward_model": pa.array(
                [{"ground_truth": "2", "style": "rule"}, {"ground_truth": "6", "style": "rule"}]
            ),
            "extra_info": pa.array(
                [
                    {"answer": "1 + 1 = 2\n#### 2", "index": 0, "question": "q", "split": "train"},
                    {"answer": "#### 6", "index": 1, "question": "q2", "split": "train"},
                ]
            ),
        }
    )
    path = tmp_path / "gsm8k_train.parquet"
    pq.write_table(table, path)
    dataset = RLDataset(str(path), tokenizer, _cfg())
    assert len(dataset) == 2
    item = dataset[1]
    assert item.ground_truth == "6"
    assert item.extra_info["answer"] == "#### 6"
    assert item.data_source == "openai/gsm8k"
    assert item.ability == "math"
    assert item.index == 1


def test_chat_template_applied_and_tokenized(tmp_path: Path, tokenizer: Any):
    path = _write(tmp_path / "a.parquet", [_row(0)])
    item = RLDataset(path, tokenizer, _cfg())[0]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert item.raw_prompt == expected
    assert item.input_ids == tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert item.input_ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")

    plain = RLDataset(path, tokenizer, _cfg(apply_chat_template=False))[0]
    assert plain.raw_prompt == "Be brief.\nWhat is 2 + 3?"


def test_several_files_and_indices(tmp_path: Path, tokenizer: Any):
    a = _write(tmp_path / "a.parquet", [_row(0), _row(1)])
    b = _write(tmp_path / "b.parquet", [_row(2)])
    dataset = RLDataset([a, b], tokenizer, _cfg())
    assert [dataset[i].index for i in range(3)] == [0, 1, 2]
    assert [dataset[i].ground_truth for i in range(3)] == ["0", "1", "2"]


def test_overlong_prompts_filtered_truncated_or_rejected(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture
):
    long_question = "word " * 200
    path = _write(tmp_path / "long.parquet", [_row(0), _row(1, long_question), _row(2)])
    filtered = RLDataset(path, tokenizer, _cfg(max_prompt_length=40))
    assert [item.ground_truth for item in filtered.items] == ["0", "2"]
    assert filtered.filtered == 1
    assert "filtered 1 of 3 prompts" in capsys.readouterr().err

    full = tokenizer(
        tokenizer.apply_chat_template(
            _row(1, long_question)["prompt"], add_generation_prompt=True, tokenize=False
        ),
        add_special_tokens=False,
    )["input_ids"]
    left = RLDataset(
        path,
        tokenizer,
        _cfg(max_prompt_length=40, filter_overlong_prompts=False, truncation="left"),
    )
    assert left[1].input_ids == full[-40:]
    right = RLDataset(
        path,
        tokenizer,
        _cfg(max_prompt_length=40, filter_overlong_prompts=False, truncation="right"),
    )
    assert right[1].input_ids == full[:40]

    with pytest.raises(DataError) as info:
        RLDataset(path, tokenizer, _cfg(max_prompt_length=40, filter_overlong_prompts=False))
    text = str(info.value)
    assert "long.parquet" in text and "row 1" in text and "'prompt'" in text
    assert f"{len(full)} tokens" in text


def test_missing_column_names_file_and_column(tmp_path: Path, tokenizer: Any):
    rows = [_row(0)]
    del rows[0]["reward_model"]
    path = _write(tmp_path / "no_rm.parquet", rows)
    with pytest.raises(DataError) as info:
        RLDataset(path, tokenizer, _cfg())
    assert "no_rm.parquet" in str(info.value) and "'reward_model'" in str(info.value)

    path = _write(tmp_path / "other_key.parquet", [_row(0)])
    with pytest.raises(DataError, match=r"data\.prompt_key='question'"):
        RLDataset(path, tokenizer, _cfg(prompt_key="question"))


@pytest.mark.parametrize(
    ("column", "value", "expected_column"),
    [
        ("data_source", None, "'data_source'"),
        ("prompt", [], "'prompt'"),
        ("prompt", [{"role": "user", "content": None}], "'prompt[0]'"),
        ("reward_model", None, "'reward_model'"),
        ("reward_model", {"style": "rule", "ground_truth": None}, "'reward_model.ground_truth'"),
    ],
)
def test_malformed_row_names_file_row_and_column(
    tmp_path: Path, tokenizer: Any, column: str, value: Any, expected_column: str
):
    bad = _row(3)
    bad[column] = value
    path = _write(tmp_path / f"bad_{column}.parquet", [_row(0), _row(1), _row(2), bad])
    with pytest.raises(DataError) as info:
        RLDataset(path, tokenizer, _cfg())
    text = str(info.value)
    assert f"bad_{column}.parquet" in text
    assert "row 3" in text
    assert expected_column in text
    assert "expected" in text


@pytest.mark.parametrize(
    ("column", "values", "expected"),
    [
        ("data_source", [1, 2], "a non-empty string"),
        ("prompt", ["plain text", "more"], "list of {role, content} messages"),
        ("extra_info", [5, 6], "a struct/dict"),
        ("ability", [1, 2], "a string"),
    ],
)
def test_wrong_column_type(
    tmp_path: Path, tokenizer: Any, column: str, values: list, expected: str
):
    rows = [_row(0), _row(1)]
    for row, value in zip(rows, values):
        row[column] = value
    path = _write(tmp_path / f"typed_{column}.parquet", rows)
    with pytest.raises(DataError) as info:
        RLDataset(path, tokenizer, _cfg())
    text = str(info.value)
    assert f"typed_{column}.parquet: row 0 (0-based), column '{column}'" in text
    assert expected in text


def test_missing_file_and_not_parquet(tmp_path: Path, tokenizer: Any):
    with pytest.raises(DataError, match="no such data file"):
        RLDataset(str(tmp_path / "nope.parquet"), tokenizer, _cfg())
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(DataError, match=r"junk\.parquet: not a readable parquet file"):
        RLDataset(str(junk), tokenizer, _cfg())


def test_collate_left_pads(tmp_path: Path, tokenizer: Any):
    path = _write(tmp_path / "c.parquet", [_row(0, "Hi"), _row(1, "A much longer question here")])
    dataset = RLDataset(path, tokenizer, _cfg())
    short, long = dataset[0], dataset[1]
    batch = collate([short, long], pad_token_id=0)
    width = len(long.input_ids)
    pad = width - len(short.input_ids)
    assert batch["input_ids"].shape == (2, width)
    assert batch["input_ids"][0].tolist() == [0] * pad + short.input_ids
    assert batch["attention_mask"][0].tolist() == [0] * pad + [1] * len(short.input_ids)
    assert batch["position_ids"][0].tolist() == [0] * pad + list(range(len(short.input_ids)))
    assert torch.equal(batch["position_ids"][1], torch.arange(width))
    assert list(batch["ground_truth"]) == ["0", "1"]
    assert list(batch["index"]) == [0, 1]
    assert batch["extra_info"][1] == {"split": "train", "index": 1}
    assert batch["raw_prompt"][0] == short.raw_prompt
    assert list(batch["data_source"]) == ["openai/gsm8k"] * 2


def test_prompt_key_and_reward_fn_key_pick_other_columns(tmp_path: Path, tokenizer: Any):
    row = _row(0)
    row["question"] = row.pop("prompt")
    row["task"] = "exact_match"
    path = _write(tmp_path / "renamed.parquet", [row])
    item = RLDataset(path, tokenizer, _cfg(prompt_key="question", reward_fn_key="task"))[0]
    assert item.data_source == "exact_match"
    assert item.raw_prompt.endswith("What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(DataError, match=r"data\.reward_fn_key='src'"):
        RLDataset(path, tokenizer, _cfg(prompt_key="question", reward_fn_key="src"))


# ---- rows whose data_source has no scorer ------------------------------------------------------
def _with_source(i: int, source: str) -> dict[str, Any]:
    return {**_row(i), "data_source": source}


def test_rows_without_a_scorer_below_the_share_are_dropped_with_a_count(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [_row(i) for i in range(9)] + [_with_source(9, "my/unknown")]
    path = _write(tmp_path / "d.parquet", rows)
    dataset = RLDataset(path, tokenizer, _cfg(), has_scorer=lambda s: s == "openai/gsm8k")
    assert [item.index for item in dataset.items] == list(range(9))
    assert (
        f"polyrl: dropped 1 of 10 rows that cannot teach ({path}): no scorer for data_source "
        "'my/unknown' (1)"
    ) in capsys.readouterr().err


def test_rows_without_a_scorer_above_the_share_are_refused(tmp_path: Path, tokenizer: Any):
    rows = [_row(i) for i in range(7)] + [_with_source(i, "my/unknown") for i in range(7, 10)]
    path = _write(tmp_path / "d.parquet", rows)
    gsm8k_only = {"has_scorer": lambda source: source == "openai/gsm8k"}
    with pytest.raises(DataError, match=r"^3 of 10 rows of .* cannot teach anything: no scorer"):
        RLDataset(path, tokenizer, _cfg(max_unteachable_share=0.25), **gsm8k_only)
    with pytest.raises(ConfigError, match=r"max_unteachable_share=1\.5 must be a share"):
        RLDataset(path, tokenizer, _cfg(max_unteachable_share=1.5))


def test_the_run_knows_which_sources_its_reward_scores() -> None:
    from polyrl.config import load_config
    from polyrl.data.unteachable import scorer_check

    has_scorer = scorer_check(load_config(["recipe=tiny"]))
    assert has_scorer is not None
    assert has_scorer("openai/gsm8k") and has_scorer("reasoning_gym/chain_sum")
    assert has_scorer("polyrl/tiny_digits") and not has_scorer("my/unknown")
    custom = load_config(["recipe=tiny", "custom_reward_function.path=/any/file.py"])
    assert scorer_check(custom) is None  # the user's function may score any source


def test_training_data_knows_the_data_sources_of_both_sets() -> None:
    """The reward provider starts only what the run's data sources need (RewardContext)."""
    from transformers import AutoTokenizer

    from polyrl.api import load_config
    from polyrl.models.resolve import resolve_model_path
    from polyrl.trainer.trainer import prompt_data

    cfg = load_config(["recipe=tiny"])
    tokenizer = AutoTokenizer.from_pretrained(
        resolve_model_path(str(cfg.actor_rollout_ref.model.path))
    )
    assert prompt_data(cfg, tokenizer).data_sources == frozenset({"polyrl/tiny_digits"})
