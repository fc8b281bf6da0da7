"""A third-party algorithm plugin, written from the docs alone, installed with pip and selected
by name, adds a stage to the step of a real ``recipe=tiny`` run. The run has one worker, in the
test's process (``IN_PROCESS_OVERRIDES``, :func:`plugin_packages.polyrl_here`): the step's stages
run in the driver, and workers get the driver's selections, never a registry of their own, so Ray
would add nothing this test checks.

The package is ``tests/fixtures/polyrl_algo_overlong``; the docs page "Writing an algorithm
plugin" (docs/writing-plugins/algorithm.md) shows its files verbatim (checked here), so the
example a user copies is the one tested.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plugin_packages import ROOT, doc_blocks, install_to_target, polyrl_here

from polyrl.api.testing import IN_PROCESS_OVERRIDES

PACKAGE = ROOT / "tests" / "fixtures" / "polyrl_algo_overlong"
FILES = (
    "pyproject.toml",
    "src/polyrl_algo_overlong/plugin.py",
    "src/polyrl_algo_overlong/stages.py",
)


def test_readme_shows_the_tested_package_file_for_file() -> None:
    blocks = doc_blocks(ROOT / "docs" / "writing-plugins" / "algorithm.md", "polyrl-algo-overlong")
    for path in FILES:
        assert path in blocks, f"README lacks the file {path} of the algorithm plugin example"
        assert blocks[path] == (PACKAGE / path).read_text(), f"README's {path} differs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_to_target(PACKAGE, tmp_path_factory.mktemp("algo_plugin"))


def test_validate_shows_the_inserted_stage(site: Path) -> None:
    done = polyrl_here(site, "validate", "recipe=tiny", "algorithm.name=grpo_overlong")
    assert done.returncode == 0, done.stderr
    assert "overlong_penalty" in done.stdout + done.stderr
    # the run plan: the outside algorithm with its package, version and resolved settings
    assert "  algorithm  " in done.stdout and "grpo_overlong (polyrl-algo-overlong " in done.stdout
    assert "plugins.grpo_overlong.buffer_len = " in done.stdout
    assert "pools:\n  global: 2 worker(s)" in done.stdout


def test_its_settings_are_checked_against_its_config_class(site: Path) -> None:
    done = polyrl_here(
        site, "validate", "recipe=tiny", "algorithm.name=grpo_overlong",
        "plugins.grpo_overlong.bufer_len=2",
    )  # fmt: skip
    assert done.returncode != 0
    assert "Did you mean plugins.grpo_overlong.buffer_len?" in done.stderr


@pytest.mark.slow
def test_selected_by_name_its_stage_runs_in_a_real_training_run(site: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = polyrl_here(
        site, "train", "recipe=tiny", *IN_PROCESS_OVERRIDES, "algorithm.name=grpo_overlong",
        "plugins.grpo_overlong.buffer_len=8", f"trainer.default_local_dir={out}",
        "trainer.total_training_steps=2", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.export_hf_model=false",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert 0.0 <= record["overlong/penalized_frac"] <= 1.0
        assert record["overlong/penalty_mean"] <= 0.0
        assert "timing_s/overlong_penalty" in record
