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


def test_a_run_shorter_than_the_window_is_judged_when_it_ends() -> None:
    guard = ScoringFailureGuard(max_failure_rate=1.0, window_steps=3)
    guard.record(1, [failed("boom")] * 4)  # a one-step run: the window never fills
    with pytest.raises(RewardError, match="failed for 4 of 4 samples over steps 1-1"):
        guard.finish()
    honest = ScoringFailureGuard(max_failure_rate=1.0, window_steps=3)
    honest.record(1, [failed("boom")] * 3 + [OK])
    honest.finish()  # one sample scored: the default rate lets it finish
    ScoringFailureGuard(max_failure_rate=1.0, window_steps=3).finish()  # no step at all


def test_the_pipeline_finishes_every_stage_after_the_last_step() -> None:
    from polyrl.step.pipeline import Stage, StepPipeline
    from polyrl.step.stages import RewardStage

    class Noted(Stage):
        name = "noted"
        finished = False

        def finish(self) -> None:
            self.finished = True

    class Reward(RewardStage):
        def __init__(self) -> None:
            self.guard = ScoringFailureGuard(max_failure_rate=1.0, window_steps=2)

    noted, reward = Noted(), Reward()
    reward.guard.record(1, [failed("boom")])
    with pytest.raises(RewardError):
        StepPipeline([noted, reward], initial_keys=()).finish()
    assert noted.finished
