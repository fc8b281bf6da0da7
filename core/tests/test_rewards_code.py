"""Data-source scorers from plugins: how the built-in dispatcher finds them, and the one line a
``code`` row gets when polyrl-reward-code is not installed (the scorer itself is tested in
plugins/reward_code)."""

from __future__ import annotations

from typing import Any

import pytest

from polyrl.errors import ConfigError
from polyrl.inprocess import plugin_from_specs
from polyrl.registry import Provenance, Registry
from polyrl.rewards.scorers import default_compute_score, load_plugin_scorers, plugin_scorer_refs
from polyrl.specs import DataSourceScorerSpec


def longer_than(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any, settings):
    return {"score": float(len(solution_str) > settings["min_chars"]), "source": 1.0}


def _registry(*specs_by_package: tuple[str, DataSourceScorerSpec]) -> Registry:
    registry = Registry()
    for package, spec in specs_by_package:
        registry.add_plugin(plugin_from_specs(spec), Provenance("p", package, "1.0"))
    return registry


LONG = DataSourceScorerSpec(
    name="long",
    description="longer than min_chars",
    fn=longer_than,
    data_sources=("long", "long/strict"),
    settings_key="long",
)


def test_a_plugin_scorer_is_found_by_data_source_with_its_settings():
    refs = plugin_scorer_refs({"long": {"min_chars": 3}}, _registry(("polyrl-long", LONG)))
    fn = f"{__name__}:longer_than"
    assert refs == {"long": [fn, {"min_chars": 3}], "long/strict": [fn, {"min_chars": 3}]}
    scorers = load_plugin_scorers(refs)
    assert default_compute_score("long", "abcd", None, plugin_scorers=scorers)["score"] == 1.0
    assert default_compute_score("long/strict", "ab", None, plugin_scorers=scorers)["score"] == 0
    # built-in sources are untouched
    assert default_compute_score("exact_match", "a", "A", plugin_scorers=scorers) == 1.0


def test_two_packages_scoring_one_source_are_both_named():
    registry = _registry(("polyrl-long", LONG), ("other-long", LONG))
    with pytest.raises(ConfigError, match="'long' \\(polyrl-long\\) and 'long' \\(other-long\\)"):
        plugin_scorer_refs({"long": {"min_chars": 1}}, registry)


def test_a_code_row_without_the_package_says_what_to_install():
    with pytest.raises(ValueError) as caught:
        default_compute_score("code", "print(1)", {"tests": ["assert True"]})
    message = str(caught.value)
    assert "\n" not in message
    assert "pip install polyrl-reward-code" in message
