"""Verdict parsing against hand-written judge replies; scores derived by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from polyrl_reward_judge.settings import JudgeSettings
from polyrl_reward_judge.verdict import Unparsed, parse_verdict


def settings(**values):
    return SimpleNamespace(**{**JudgeSettings().__dict__, **values})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Score: 7", 0.7),
        ("The response is right.\nScore: 10", 1.0),
        ("Score:0", 0.0),
        ("Score: 2.5 because ...", 0.25),
        ("Score: 3\nScore: 9", 0.3),  # the first match decides
    ],
)
def test_score_verdicts(text, expected):
    assert parse_verdict(text, settings()) == pytest.approx(expected)


def test_score_range_maps_linearly():
    # on a 1-5 scale: 1 -> 0, 3 -> 0.5, 5 -> 1
    s = settings(score_min=1.0, score_max=5.0)
    assert [parse_verdict(f"Score: {v}", s) for v in (1, 3, 5)] == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("text", ["Score: 11", "Score: -1", "Score: 10.5"])
def test_out_of_range_scores_are_unparsed_not_clipped(text):
    verdict = parse_verdict(text, settings())
    assert isinstance(verdict, Unparsed) and "out of range [0, 10]" in verdict.reason


@pytest.mark.parametrize("text", ["", "I think it is good", "score 7", "Score: seven", "ä€\x00"])
def test_garbage_is_unparsed(text):
    assert isinstance(parse_verdict(text, settings()), Unparsed)


def test_custom_score_pattern():
    s = settings(score_pattern=r"Rating \[(\d)\]", score_min=0.0, score_max=4.0)
    assert parse_verdict("Rating [3]", s) == 0.75
    assert isinstance(parse_verdict("Score: 3", s), Unparsed)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("PASS", 1.0), ("Verdict: FAIL.", 0.0), ("It is a PASS", 1.0), ("PASSWORD", None)],
)
def test_pass_fail(text, expected):
    verdict = parse_verdict(text, settings(verdict="pass_fail"))
    if expected is None:
        assert isinstance(verdict, Unparsed)
    else:
        assert verdict == expected


def test_pass_and_fail_together_is_ambiguous():
    verdict = parse_verdict("PASS or FAIL?", settings(verdict="pass_fail"))
    assert isinstance(verdict, Unparsed) and "both" in verdict.reason


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"score": 8}', 0.8),
        ('Here you go:\n```json\n{"score": 4, "why": "partly"}\n```', 0.4),
        ('{not json} then {"score": "6"}', 0.6),  # a numeric string counts
        ('{"verdict": {"score": 5}}', None),  # no top-level field
    ],
)
def test_json(text, expected):
    verdict = parse_verdict(text, settings(verdict="json"))
    if expected is None:
        assert isinstance(verdict, Unparsed) and "no field 'score'" in verdict.reason
    else:
        assert verdict == pytest.approx(expected)


def test_json_nested_field_and_bool():
    s = settings(verdict="json", json_field="result.correct", score_min=0.0, score_max=1.0)
    assert parse_verdict('{"result": {"correct": true}}', s) == 1.0
    assert parse_verdict('{"result": {"correct": false}}', s) == 0.0


@pytest.mark.parametrize("text", ["no json here", '{"score": null}', '{"score": 12}', "[1, 2]"])
def test_json_garbage_is_unparsed(text):
    assert isinstance(parse_verdict(text, settings(verdict="json")), Unparsed)
