"""Preference files in polyrl's and TRL's layouts (written with plain pyarrow, as another tool
writes them), their batches, the tiny task's pairs, and the errors a bad file gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from polyrl.config.schema import DataConfig
from polyrl.data.generate import tiny_digit_pairs_rows, write_tiny_digit_pairs
from polyrl.errors import DataError
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID
from polyrl.rewards.scorers import tiny_digits_score
from polyrl_algo_dpo.preference import PreferenceDataset, PreferenceLoader, collate_pairs


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from polyrl.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(str(tmp_path_factory.mktemp("tiny"))))


def data_cfg(**overrides: Any) -> Any:
    values = {"max_prompt_length": 64, "max_response_length": 16, **overrides}
    return OmegaConf.merge(OmegaConf.structured(DataConfig), values)


def write(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return ids(tokenizer, rendered)


USER = [{"role": "user", "content": "Repeat 3:"}]


def test_polyrl_layout_messages_and_response_texts(tmp_path: Path, tokenizer: Any) -> None:
    path = write(tmp_path / "p.parquet", [{"prompt": USER, "chosen": "333", "rejected": "55"}])
    (pair,) = PreferenceDataset(path, tokenizer, data_cfg()).pairs
    assert pair.prompt_ids == chat_prompt_ids(tokenizer, USER)
    assert pair.chosen_ids == [*ids(tokenizer, "333"), EOS_TOKEN_ID]  # a response ends with EOS
    assert pair.rejected_ids == [*ids(tokenizer, "55"), EOS_TOKEN_ID]


def test_trl_standard_layout_is_plain_text(tmp_path: Path, tokenizer: Any) -> None:
    rows = [{"prompt": "The digit", "chosen": " 3", "rejected": " five"}]
    (pair,) = PreferenceDataset(write(tmp_path / "t.parquet", rows), tokenizer, data_cfg()).pairs
    assert pair.prompt_ids == tokenizer("The digit")["input_ids"]  # no chat template
    assert pair.chosen_ids == [*ids(tokenizer, " 3"), EOS_TOKEN_ID]


def test_trl_conversational_layout(tmp_path: Path, tokenizer: Any) -> None:
    rows = [
        {
            "prompt": USER,
            "chosen": [{"role": "assistant", "content": "333"}],
            "rejected": [{"role": "assistant", "content": "55"}],
            "score_chosen": 9.0,  # other columns of TRL datasets are ignored
        }
    ]
    (pair,) = PreferenceDataset(write(tmp_path / "c.parquet", rows), tokenizer, data_cfg()).pairs
    assert pair.prompt_ids == chat_prompt_ids(tokenizer, USER)
    assert pair.chosen_ids == [*ids(tokenizer, "333"), EOS_TOKEN_ID]


def test_trl_implicit_prompt_layout(tmp_path: Path, tokenizer: Any) -> None:
    rows = [
        {
            "chosen": [*USER, {"role": "assistant", "content": "333"}],
            "rejected": [*USER, {"role": "assistant", "content": "55"}],
        }
    ]
    (pair,) = PreferenceDataset(write(tmp_path / "i.parquet", rows), tokenizer, data_cfg()).pairs
    assert pair.prompt_ids == chat_prompt_ids(tokenizer, USER)
    assert pair.rejected_ids == [*ids(tokenizer, "55"), EOS_TOKEN_ID]


def test_pairs_collate_interleaved_in_the_rollout_layout(tmp_path: Path, tokenizer: Any) -> None:
    rows = [
        {"prompt": USER, "chosen": "333", "rejected": "5"},
        {"prompt": [{"role": "user", "content": "7"}], "chosen": "77", "rejected": "1111"},
    ]
    dataset = PreferenceDataset(write(tmp_path / "p.parquet", rows), tokenizer, data_cfg())
    batch = collate_pairs(dataset.pairs, PAD_TOKEN_ID)
    first, second = dataset.pairs
    prompt_width = max(len(first.prompt_ids), len(second.prompt_ids))
    responses = [first.chosen_ids, first.rejected_ids, second.chosen_ids, second.rejected_ids]
    assert batch["responses"].shape == (4, max(map(len, responses)))
    for row, response in enumerate(responses):
        assert batch["response_mask"][row].tolist() == [1] * len(response) + [0] * (
            batch["responses"].shape[1] - len(response)
        )
        assert batch["responses"][row, : len(response)].tolist() == response
    # Row 3: the second prompt, left-padded, then its rejected response, right-padded.
    row = batch["input_ids"][3]
    start = prompt_width - len(second.prompt_ids)
    assert row[:start].tolist() == [PAD_TOKEN_ID] * start
    assert row[start:prompt_width].tolist() == second.prompt_ids
    assert batch["position_ids"][3, start].item() == 0
    assert batch["attention_mask"][3].sum().item() == len(second.prompt_ids) + 5
    assert list(batch["index"]) == [0, 0, 1, 1]


def test_tiny_digit_pairs_prefer_what_the_task_scores_higher() -> None:
    for row in tiny_digit_pairs_rows(size=50, seed=3, split="train"):
        digit = next(c for c in row["prompt"][0]["content"] if c.isdigit())
        assert tiny_digits_score(row["chosen"], digit)["score"] == 1.0
        assert tiny_digits_score(row["rejected"], digit)["score"] == 0.5


def test_loader_draws_pairs_and_resumes(tmp_path: Path, tokenizer: Any) -> None:
    files = write_tiny_digit_pairs(tmp_path, train_size=12, val_size=2)
    dataset = PreferenceDataset(str(files["train"]), tokenizer, data_cfg())
    loader = PreferenceLoader(dataset, 4, shuffle=True, seed=5)
    assert len(loader) == 3
    loader.next_batch()
    state = loader.state_dict()
    expected = loader.next_batch()
    assert len(expected) == 8  # 4 pairs, 2 rows each
    resumed = PreferenceLoader(dataset, 4, shuffle=True, seed=5)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.next_batch()["input_ids"], expected["input_ids"])


def test_overlong_prompts_and_responses(tmp_path: Path, tokenizer: Any) -> None:
    long_prompt = [{"role": "user", "content": "Repeat 3: " + "three " * 30}]
    rows = [
        {"prompt": long_prompt, "chosen": "3" * 40, "rejected": "5"},
        {"prompt": USER, "chosen": "3" * 40, "rejected": "5"},
    ]
    path = write(tmp_path / "long.parquet", rows)
    kept = PreferenceDataset(path, tokenizer, data_cfg(max_prompt_length=20))
    assert [p.index for p in kept.pairs] == [1] and kept.filtered == 1
    assert len(kept.pairs[0].chosen_ids) == 16 and kept.cut_responses == 1
    cut = PreferenceDataset(
        path,
        tokenizer,
        data_cfg(max_prompt_length=20, filter_overlong_prompts=False, truncation="left"),
    )
    assert len(cut.pairs[0].prompt_ids) == 20
    with pytest.raises(DataError, match=r"row 0 \(0-based\), column 'prompt'.*max_prompt_length"):
        PreferenceDataset(
            path, tokenizer, data_cfg(max_prompt_length=20, filter_overlong_prompts=False)
        )


def test_bad_files_name_file_row_and_column(tmp_path: Path, tokenizer: Any) -> None:
    no_rejected = write(tmp_path / "a.parquet", [{"prompt": USER, "chosen": "3"}])
    with pytest.raises(DataError, match=r"a\.parquet: missing column\(s\) rejected"):
        PreferenceDataset(no_rejected, tokenizer, data_cfg())
    two_turns = [{"role": "assistant", "content": "3"}, {"role": "user", "content": "and?"}]
    bad = write(tmp_path / "b.parquet", [{"prompt": USER, "chosen": two_turns, "rejected": "4"}])
    with pytest.raises(DataError, match=r"b\.parquet: row 0 \(0-based\), column 'chosen'"):
        PreferenceDataset(bad, tokenizer, data_cfg())
    other_prompts = [
        {
            "chosen": [*USER, {"role": "assistant", "content": "3"}],
            "rejected": [
                {"role": "user", "content": "Repeat 4:"},
                {"role": "assistant", "content": "4"},
            ],
        }
    ]
    implicit = write(tmp_path / "c.parquet", other_prompts)
    with pytest.raises(DataError, match="shares every message but the last"):
        PreferenceDataset(implicit, tokenizer, data_cfg())


def test_the_old_core_paths_warn_and_forward_to_the_plugin() -> None:
    """``polyrl.data.preference`` and ``polyrl.config.checks.data.preference_file_problems``
    were core's; they resolve to the plugin's objects with a DeprecationWarning, and importing
    the old modules imports nothing of the plugin."""
    import polyrl_algo_dpo.config
    import polyrl_algo_dpo.preference

    with pytest.deprecated_call(match="import PreferenceDataset from polyrl_algo_dpo.preference"):
        from polyrl.data.preference import PreferenceDataset as Old
    assert Old is polyrl_algo_dpo.preference.PreferenceDataset
    with pytest.deprecated_call(match="import it from polyrl_algo_dpo.config"):
        from polyrl.config.checks.data import preference_file_problems
    assert preference_file_problems is polyrl_algo_dpo.config.preference_file_problems
    code = (
        "import sys, polyrl.data.preference, polyrl.config.checks.data\n"
        "print([m for m in sys.modules if m.startswith('polyrl_algo_dpo')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- pairs that cannot teach -------------------------------------------------------------------
def pair_rows(good: int, same: int, empty: int) -> list[dict[str, Any]]:
    return (
        [{"prompt": USER, "chosen": "333", "rejected": f"5{i}"} for i in range(good)]
        + [{"prompt": USER, "chosen": "333", "rejected": "333"} for _ in range(same)]
        + [{"prompt": USER, "chosen": " ", "rejected": ""} for _ in range(empty)]
    )


def test_identical_or_empty_pairs_below_the_share_are_dropped_with_a_count(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "p.parquet", pair_rows(good=18, same=1, empty=1))
    dataset = PreferenceDataset(path, tokenizer, data_cfg())  # 2 of 20 = the default 0.1
    assert len(dataset) == 18
    assert sorted(p.index for p in dataset.pairs) == list(range(18))
    assert (
        f"polyrl: dropped 2 of 20 rows that cannot teach ({path}): chosen and rejected are "
        "identical (1); chosen or rejected is empty (1)"
    ) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("rows", "share", "counted"),
    [
        (pair_rows(good=17, same=3, empty=0), 0.1, "3 of 20"),  # 0.15 > 0.1
        (pair_rows(good=0, same=4, empty=4), 1.0, "8 of 8"),  # none left: refused at any share
    ],
)
def test_pairs_that_cannot_teach_above_the_share_are_refused_in_one_line(
    tmp_path: Path, tokenizer: Any, rows: list[dict[str, Any]], share: float, counted: str
) -> None:
    path = write(tmp_path / "p.parquet", rows)
    with pytest.raises(DataError) as info:
        PreferenceDataset(path, tokenizer, data_cfg(max_unteachable_share=share))
    message = str(info.value)
    assert message.startswith(f"{counted} rows of {path} cannot teach anything:")
    assert "data.max_unteachable_share" in message and "\n" not in message
