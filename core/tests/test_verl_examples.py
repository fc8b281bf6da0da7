"""verl's own example scripts (every one under examples/ that launches verl.trainer.main_ppo, at
the verl commit the fixture records) replayed through ``polyrl validate`` with only the model
and data paths swapped (core/tests/verl_replay.py). No script may stop on an unknown key; the
counts of accepted / hardware-only / refused-by-feature scripts are printed (``-s``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_replay import load_fixture, replay, report

from polyrl.config.verl_compat import verl_commit

# Keys verl's scripts set that belong to a plugin outside this change: listed with their owner
# until it declares them (each makes its scripts count as "unknown" in the report).
PENDING: dict[str, str] = {}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> list:
    fixture = load_fixture()
    tmp = Path(tmp_path_factory.mktemp("verl"))
    configs = fixture.get("configs", {})
    return [replay(s, a, configs, tmp) for s, a in sorted(fixture["scripts"].items())]


def test_the_fixture_and_the_key_list_come_from_one_verl_commit() -> None:
    fixture = load_fixture()
    assert fixture["commit"] == verl_commit()
    assert len(fixture["scripts"]) >= 120


@pytest.mark.slow
def test_no_verl_example_stops_on_an_unknown_key(outcomes: list) -> None:
    print(report(outcomes))
    unknown = [
        (o.script, p)
        for o in outcomes
        for p in o.problems
        if "unknown config key" in p and not any(f"'{k}'" in p for k in PENDING)
    ]
    assert unknown == []
