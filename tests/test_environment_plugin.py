"""A third-party environment plugin, written from the docs alone, installed with pip and selected
by name, drives the multi-turn episodes of a real ``recipe=tiny`` run (one worker in the run's
process: the environment lives in the driver either way).

The package is ``tests/fixtures/polyrl_env_guess``; the docs page "Writing an environment plugin"
(docs/writing-plugins/environment.md) shows its files verbatim (checked here).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from plugin_packages import ROOT, doc_blocks, install_to_target, polyrl

from polyrl.api.testing import IN_PROCESS_OVERRIDES

PACKAGE = ROOT / "tests" / "fixtures" / "polyrl_env_guess"
FILES = ("pyproject.toml", "src/polyrl_env_guess/plugin.py", "src/polyrl_env_guess/game.py")
MULTI_TURN = (
    "actor_rollout_ref.rollout.multi_turn.enable=true",
    "actor_rollout_ref.rollout.multi_turn.environment=guess",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
    "data.max_response_length=48",
)


def test_the_docs_show_the_tested_package_file_for_file() -> None:
    blocks = doc_blocks(ROOT / "docs" / "writing-plugins" / "environment.md", "polyrl-env-guess")
    for path in FILES:
        assert path in blocks, f"the docs page lacks the file {path} of the environment example"
        assert blocks[path] == (PACKAGE / path).read_text(), f"the docs page's {path} differs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_to_target(PACKAGE, tmp_path_factory.mktemp("env_plugin"))


def test_a_game_played_by_hand_scores_as_its_docstring_says(site: Path) -> None:
    sys.path.insert(0, str(site))
    try:
        from polyrl_env_guess.game import GuessEnvironment
    finally:
        sys.path.remove(str(site))
    from polyrl.api import AssistantTurn, EnvironmentContext

    async def play(guesses: list[str]):
        episode = GuessEnvironment(EnvironmentContext(config=None)).episode({"ground_truth": "5"})
        await episode.start()
        hints = []
        for index, text in enumerate(guesses):
            obs = await episode.step(AssistantTurn(index, text, (1,)))
            hints.append("done" if obs.done else obs.messages[0]["content"])
        return hints, await episode.finish("done" if hints[-1] == "done" else "max")

    hints, result = asyncio.run(play(["3", "it is 7", "5"]))
    assert hints == ["higher", "lower", "done"]
    assert result.reward == 0.5 and result.metrics == {"won": 1.0}
    hints, result = asyncio.run(play(["no idea", "9"]))
    assert hints == ["Answer with one digit.", "lower"] and result.reward == 0.0


def test_listed_and_validated(site: Path) -> None:
    listed = polyrl(site, "plugins")
    assert listed.returncode == 0, listed.stderr
    assert "guess" in listed.stdout and "polyrl-env-guess" in listed.stdout
    done = polyrl(site, "validate", "recipe=tiny", *MULTI_TURN)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_selected_by_name_it_drives_a_real_training_run(site: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = polyrl(
        site, "train", "recipe=tiny", *IN_PROCESS_OVERRIDES, *MULTI_TURN,
        f"trainer.default_local_dir={out}",
        "trainer.total_training_steps=2", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.export_hf_model=false",
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["multi_turn/guesses/mean"] >= 1.0
        assert 0.0 <= record["multi_turn/won/mean"] <= 1.0
        assert record["multi_turn/assistant_turns/mean"] > 1.0  # hints were answered
