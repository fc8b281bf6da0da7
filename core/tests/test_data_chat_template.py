"""verl's ``actor_rollout_ref.model.custom_chat_template`` (a Jinja template replacing the
tokenizer's) and ``data.apply_chat_template_kwargs`` (extra arguments the template reads) change
what the prompts render to; bad values are one line each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from polyrl.config import load_config
from polyrl.config.validate import validate_config, verl_lines
from polyrl.data.chat_template import TEMPLATE_KEY, use_custom_template
from polyrl.data.dataset import RLDataset
from polyrl.envs.chat import ChatTokens
from polyrl.errors import ConfigError, DataError

# Renders each message in brackets and, when the caller passes enable_thinking=false (Qwen3's
# switch), a "/no_think" marker before the assistant header.
TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}: {{ m['content'] }}]{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
    "{% if add_generation_prompt %}<answer>{% endif %}"
)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    from polyrl.models.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("tiny_model")))


def _tokenizer(folder: str, template: str | None = None) -> Any:
    from transformers import AutoTokenizer

    return use_custom_template(AutoTokenizer.from_pretrained(folder), template)


def _file(tmp_path: Path) -> str:
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
            "reward_model": {"style": "rule", "ground_truth": "5"},
        }
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _ids(tokenizer: Any, file: str, **data: Any) -> list[int]:
    cfg = {"max_prompt_length": 256, **data}
    return RLDataset(file, tokenizer, cfg).items[0].input_ids


def test_a_custom_template_changes_the_prompt_ids(model_folder: str, tmp_path: Path) -> None:
    file = _file(tmp_path)
    own = _tokenizer(model_folder)
    custom = _tokenizer(model_folder, TEMPLATE)
    ids = _ids(custom, file)
    assert ids != _ids(own, file)
    assert custom.decode(ids) == "[user: What is 2 + 3?]<answer>"
    # multi-turn renders with the same tokenizer, so the same template
    chat = ChatTokens(custom, [custom.eos_token_id])
    assert chat.prompt_ids([{"role": "user", "content": "What is 2 + 3?"}], []) == ids


def test_template_kwargs_reach_the_template(model_folder: str, tmp_path: Path) -> None:
    file = _file(tmp_path)
    tokenizer = _tokenizer(model_folder, TEMPLATE)
    plain = tokenizer.decode(_ids(tokenizer, file))
    off = tokenizer.decode(
        _ids(tokenizer, file, apply_chat_template_kwargs={"enable_thinking": False})
    )
    on = tokenizer.decode(
        _ids(tokenizer, file, apply_chat_template_kwargs={"enable_thinking": True})
    )
    assert off == "[user: What is 2 + 3?]/no_think<answer>"
    assert plain == on == "[user: What is 2 + 3?]<answer>"


def test_bad_values_are_one_line_each(model_folder: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a valid Jinja template"):
        _tokenizer(model_folder, "{% for m in messages %}")
    with pytest.raises(DataError, match="must be a mapping"):
        _ids(_tokenizer(model_folder), _file(tmp_path), apply_chat_template_kwargs=["x"])


def test_validate_accepts_both_keys_and_refuses_a_broken_template() -> None:
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    overrides = [
        f"{TEMPLATE_KEY}='{template}'",
        "data.apply_chat_template_kwargs.enable_thinking=false",
    ]
    cfg = load_config(["recipe=tiny", *overrides])
    assert cfg.actor_rollout_ref.model.custom_chat_template == template
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False}
    problems, _ = verl_lines(cfg)
    assert problems == []
    assert not [p for p in validate_config(cfg) if "template" in p]
    broken = load_config(["recipe=tiny", f"{TEMPLATE_KEY}='{{% if x %}}'"])
    found = [p for p in validate_config(broken) if TEMPLATE_KEY in p]
    assert len(found) == 1 and "not a valid Jinja template" in found[0]


def test_a_template_in_a_verl_yaml_arrives_unchanged(tmp_path: Path) -> None:
    """verl's multi-turn configs hold the template in YAML, with Jinja string escapes (``'\\n'``)
    and quotes: ``--config-name`` must hand it to the config byte for byte."""
    import yaml

    from polyrl.config.verl_cli import config_file_overrides

    template = "{{- '<|im_start|>system\\n' }}{{ \"it's\" }}{% if x %}\\\\{% endif %}"
    config = {"actor_rollout_ref": {"model": {"custom_chat_template": template}}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(config))
    cfg = load_config(["recipe=tiny", *config_file_overrides(str(tmp_path), "mine")])
    assert cfg.actor_rollout_ref.model.custom_chat_template == template
