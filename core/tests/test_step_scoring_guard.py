"""A run whose rewards keep failing to score stops with the reason."""

from __future__ import annotations

import pytest

from polyrl.errors import RewardError
from polyrl.interfaces import RewardResult
from polyrl.step.scoring_guard import ScoringFailureGuard

OK = RewardResult(score=1.0)


def failed(error: str) -> RewardResult:
    return RewardResult(score=0.0, error=error)


def test_every_sample_failing_over_the_window_stops_with_the_most_common_error() -> None:
    guard = ScoringFailureGuard(max_failure_rate=1.0, window_steps=2)
    guard.record(1, [failed("no scorer for data_source 'x'")] * 3 + [failed("NaN")])
    with pytest.raises(RewardError) as caught:
        guard.record(2, [failed("no scorer for data_source 'x'")] * 4)
    message = str(caught.value)
    assert "failed for 8 of 8 samples over steps 1-2" in message
    assert "most common error (7x): no scorer for data_source 'x'" in message
    assert "reward_model.max_failure_rate" in message


def test_the_window_must_fill_before_the_guard_judges() -> None:
    guard = ScoringFailureGuard(max_failure_rate=1.0, window_steps=3)
    guard.record(1, [failed("boom")])
    guard.record(2, [failed("boom")])  # two of three steps: not yet
    with pytest.raises(RewardError):
        guard.record(3, [failed("boom")])


def test_a_working_sample_keeps_the_default_guard_quiet() -> None:
    guard = ScoringFailureGuard(max_failure_rate=1.0, window_steps=2)
    for step in range(1, 6):
        guard.record(step, [failed("boom")] * 7 + [OK])


def test_a_lower_threshold_stops_on_partial_failure_and_resumes_its_window() -> None:
    guard = ScoringFailureGuard(max_failure_rate=0.5, window_steps=2)
    guard.record(1, [failed("boom"), OK])
    state = guard.state_dict()
    resumed = ScoringFailureGuard(max_failure_rate=0.5, window_steps=2)
    resumed.load_state_dict(state)
    with pytest.raises(RewardError, match="failed for 3 of 4 samples over steps 1-2"):
        resumed.record(2, [failed("boom"), failed("boom")])
