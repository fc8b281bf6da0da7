"""The docs pages written from the code: the configuration reference and the plugin pages.

``mkdocs build --strict`` itself runs in ``.ci/run``; these check what the pages say.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from polyrl import hookspecs
from polyrl.config.keys import schema_keys

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import config_reference  # noqa: E402 - from scripts/, put on the path above
import plugin_pages  # noqa: E402


@pytest.fixture(scope="module")
def reference() -> str:
    return config_reference.render()


def row(reference: str, key: str) -> list[str]:
    """The cells of ``key``'s row: key, type, default, owner, verl, meaning."""
    line = next(line for line in reference.splitlines() if line.startswith(f"| `{key}` |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def test_the_reference_lists_every_key_of_the_schema(reference: str):
    listed = {line.split("`")[1] for line in reference.splitlines() if line.startswith("| `")}
    missing = [key for key in schema_keys() if key not in listed]
    assert not missing, f"keys missing from the configuration reference: {missing}"


def test_a_row_gives_type_default_owner_verl_name_and_meaning(reference: str):
    assert row(reference, "data.train_files") == [
        "`data.train_files`", "any", "required", "polyrl (core)", "", "a path or a list of paths",
    ]  # fmt: skip
    assert row(reference, "algorithm.kl_ctrl.type")[1:4] == ["a string", "`fixed`", "polyrl (core)"]
    assert row(reference, "algorithm.kl_ctrl.type")[5] == "fixed \\| adaptive"
    offload = row(reference, "actor_rollout_ref.actor.fsdp_config.param_offload")
    assert offload[1:4] == ["true or false", "`false`", "polyrl-engine-fsdp"]
    # DAPO's overlong buffer: verl spells it reward_model.reward_kwargs.overlong_buffer_cfg.
    buffer = row(reference, "reward_model.overlong_buffer")
    assert buffer[1] == "group" and buffer[3] == "polyrl-algo-grpo"
    assert buffer[4] == "`reward_model.reward_kwargs.overlong_buffer_cfg`"
    assert row(reference, "actor_rollout_ref.actor.optim.clip_grad")[4] == (
        "`actor_rollout_ref.actor.grad_clip`"
    )  # one of core's aliases


@dataclass
class Commented:
    # The first line of the meaning,
    # and its second.
    plain: int = 1
    trailing: str = "a#b"  # after the value; the '#' in the string is no comment
    ignored: int = (  # type: ignore[assignment]
        "${plain}"
    )
    bare: float = 0.0


def test_field_comments_take_the_lines_above_and_the_end_of_line():
    assert config_reference.field_comments(Commented) == {
        "plain": "The first line of the meaning, and its second.",
        "trailing": "after the value; the '#' in the string is no comment",
        "ignored": "",
        "bare": "",
    }


def test_the_kinds_page_has_every_hook_with_its_example():
    page = plugin_pages.kinds_page()
    hooks = [name for name in dir(hookspecs) if name.startswith("polyrl_")]
    for hook in hooks:
        assert f"## `{hook}`" in page
    assert page.count("```python") == len(hooks)  # each hook's docstring has an example
    assert "### `TrainingEngineSpec`" in page and "| `supports_cpu` |" in page


def test_a_plugin_page_carries_its_row_of_the_support_table():
    rows = plugin_pages.support_rows()
    page = plugin_pages.plugin_page(ROOT / "plugins" / "rollout_hf", rows)
    assert page.startswith("# polyrl-rollout-hf\n")
    assert f"- **verified where**: {rows['polyrl-rollout-hf']['verified where']}" in page
    every = {f.name for f in plugin_pages.plugin_folders()}
    assert "_template" not in every and {"engine_fsdp", "algo_grpo"} <= every
