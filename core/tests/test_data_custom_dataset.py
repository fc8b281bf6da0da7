"""verl's custom dataset class (``data.custom_cls.path`` / ``name``): built as verl builds it,
its items (row dicts with ``raw_prompt``) become prompts exactly as the same rows of a
verl-format parquet file would; a class that is not a torch Dataset, or items that are not row
dicts, are refused in one line; bad settings are one line in validate."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from polyrl.config import load_config
from polyrl.config.validate import validate_config
from polyrl.data.dataset import RLDataset
from polyrl.errors import ConfigError, DataError
from polyrl.models.tiny import build_tiny_model

CLASSES = '''
import pyarrow.parquet as pq
from torch.utils.data import Dataset


class QuestionsDataset(Dataset):
    """Rows of (question, answer) made into verl's items; the system message is the class's."""

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        assert processor is None and max_samples == -1 and config.max_prompt_length == 64
        self.rows = [r for f in data_files for r in pq.read_table(f).to_pylist()]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, item):
        row = self.rows[item]
        return {
            "data_source": "polyrl/tiny_digits",
            "raw_prompt": [
                {"role": "system", "content": "Answer with digits."},
                {"role": "user", "content": row["question"]},
            ],
            "reward_model": {"style": "rule", "ground_truth": row["answer"]},
            "extra_info": {"index": item, "split": "train"},
            "dummy_tensor": None,
        }


class NotADataset:
    def __init__(self, **kwargs):
        pass


class Tuples(QuestionsDataset):
    def __getitem__(self, item):
        return ("not", "a", "row")
'''


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return AutoTokenizer.from_pretrained(build_tiny_model(str(tmp_path_factory.mktemp("tiny"))))


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    classes = tmp_path / "classes.py"
    classes.write_text(CLASSES)
    data = tmp_path / "questions.parquet"
    rows = [{"question": f"Write the digit {d}:", "answer": str(d)} for d in (3, 7)]
    pq.write_table(pa.Table.from_pylist(rows), data)
    return classes, data


def data_config(path: str | None, name: str | None) -> object:
    return OmegaConf.create({"max_prompt_length": 64, "custom_cls": {"path": path, "name": name}})


def test_the_items_are_prompts_as_the_same_parquet_rows_would_be(tokenizer, files, tmp_path):
    classes, data = files
    custom = RLDataset([str(data)], tokenizer, data_config(str(classes), "QuestionsDataset"))
    rows = [
        {
            "data_source": "polyrl/tiny_digits",
            "prompt": [
                {"role": "system", "content": "Answer with digits."},
                {"role": "user", "content": f"Write the digit {d}:"},
            ],
            "reward_model": {"style": "rule", "ground_truth": str(d)},
            "extra_info": {"index": i, "split": "train"},
        }
        for i, d in enumerate((3, 7))
    ]
    verl_format = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), verl_format)
    plain = RLDataset([str(verl_format)], tokenizer, data_config(None, None))
    assert len(custom) == 2
    for ours, theirs in zip(custom.items, plain.items):
        assert ours == theirs
    assert custom[1].ground_truth == "7" and custom[1].messages[0]["role"] == "system"


def test_verls_rules_on_the_class_and_its_items_are_one_line(tokenizer, files):
    classes, data = files
    with pytest.raises(ConfigError, match=r"must subclass torch\.utils\.data\.Dataset"):
        RLDataset([str(data)], tokenizer, data_config(str(classes), "NotADataset"))
    with pytest.raises(DataError, match=r"item 0 of .* is a tuple; verl.s items are row dicts"):
        RLDataset([str(data)], tokenizer, data_config(f"file://{classes}", "Tuples"))


@pytest.mark.parametrize(
    ("custom", "expected"),
    [
        (["data.custom_cls.path=/no/such.py", "data.custom_cls.name=D"], "no such file"),
        (["data.custom_cls.path=/no/such.py"], "go together"),
    ],
)
def test_bad_settings_are_one_line_in_validate(custom: list[str], expected: str) -> None:
    problems = validate_config(load_config(["recipe=tiny", *custom]))
    assert len(problems) == 1 and expected in problems[0], problems
