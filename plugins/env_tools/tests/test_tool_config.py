"""verl's tool-config YAML (``multi_turn.tool_config_path``) as the tools environment reads it:
entries become tools under their schema's name, a function or a verl-style class; a missing or
malformed file is one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from polyrl.api import ConfigError
from polyrl_env_tools.tools import load_tool_config

SCHEMA = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}


def test_entries_become_tools(tmp_path: Path) -> None:
    entries = [
        {"class_name": "polyrl_env_tools.builtin_tools:calculate", "tool_schema": SCHEMA},
        {
            "class_name": "polyrl_env_tools.gsm8k_interaction.Gsm8kInteraction",
            "config": {"k": 1},
            "tool_schema": {**SCHEMA, "function": {**SCHEMA["function"], "name": "cls"}},
        },
    ]
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": entries}))
    function, instance = load_tool_config(str(path))
    assert (function.name, function.fn is not None, function.instance_class) == ("calc", True, None)
    assert instance.name == "cls" and instance.config == {"k": 1}
    assert instance.instance_class.__name__ == "Gsm8kInteraction"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "cannot be read"),
        ("tools: [", "is not valid YAML"),
        ("tools: 3", "needs a 'tools:' list of {class_name, config, tool_schema}"),
        ("tools: [{class_name: x}]", "tools[0] needs class_name and tool_schema"),
    ],
)
def test_a_bad_file_is_one_line(tmp_path: Path, text: str | None, expected: str) -> None:
    path = tmp_path / "tools.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[")) as caught:
        load_tool_config(str(path))
    assert "\n" not in str(caught.value)
