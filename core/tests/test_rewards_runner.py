"""Custom reward functions from files, and the runner's handling of functions that raise or hang."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

from polyrl.errors import ConfigError, RewardError
from polyrl.interfaces.reward import RewardContext, RewardSample
from polyrl.rewards._worker import ScorerRef
from polyrl.rewards.custom import load_custom_function, normalise_score
from polyrl.rewards.provider import NaiveRewardProvider
from polyrl.rewards.runner import RewardRunner

USER_FUNCTIONS = """
import time

def as_float(data_source, solution_str, ground_truth, extra_info):
    return float(solution_str.strip() == str(ground_truth))

def as_dict(data_source, solution_str, ground_truth, extra_info):
    return {"score": len(solution_str) / 10, "length": len(solution_str), "note": "text"}

def flaky(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "raise":
        raise ZeroDivisionError("user bug")
    if solution_str == "hang":
        time.sleep(60)
    if solution_str == "none":
        return None
    if solution_str == "exit":
        import os
        os._exit(3)
    return float(solution_str == ground_truth)

NOT_A_FUNCTION = 3
"""


@pytest.fixture(scope="module")
def user_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reward_fns") / "my_reward.py"
    path.write_text(USER_FUNCTIONS)
    return path


def _samples(texts: list[str], truth: str = "ok") -> list[RewardSample]:
    return [
        RewardSample(index=i, data_source="mine", solution_str=t, ground_truth=truth)
        for i, t in enumerate(texts)
    ]


# ---- loading --------------------------------------------------------------------------------
def test_custom_function_float_and_dict(user_file: Path):
    fn = load_custom_function(user_file, "as_float")
    assert fn("mine", " ok ", "ok", {}) == 1.0
    score, extras = normalise_score(load_custom_function(user_file, "as_dict")("s", "abcd", 0, {}))
    assert score == pytest.approx(0.4)
    assert extras == {"length": 4.0}  # the non-numeric "note" is dropped


def test_custom_function_errors_are_clear(tmp_path: Path, user_file: Path):
    with pytest.raises(ConfigError, match=r"custom_reward_function.path=.*no such file"):
        load_custom_function(tmp_path / "missing.py")
    with pytest.raises(ConfigError, match="'nope' is not defined") as info:
        load_custom_function(user_file, "nope")
    assert "as_float" in str(info.value)  # lists what the file does define
    with pytest.raises(ConfigError, match="not a function"):
        load_custom_function(user_file, "NOT_A_FUNCTION")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_xyz\n")
    with pytest.raises(ConfigError, match="failed to import: ModuleNotFoundError"):
        load_custom_function(broken)


def test_normalise_score_rejects_bad_returns():
    assert normalise_score(True) == (1.0, {})
    with pytest.raises(ValueError, match="without 'score'"):
        normalise_score({"value": 1})
    with pytest.raises(TypeError, match="must be a number"):
        normalise_score("1.0")
    with pytest.raises(ValueError, match="not finite"):
        normalise_score(float("nan"))


# ---- runner in worker processes -------------------------------------------------------------
def test_raise_and_hang_are_reported_scored_and_the_pool_recovers(user_file: Path):
    runner = RewardRunner(
        ScorerRef(str(user_file), "flaky"), num_workers=2, timeout_s=1.0, failure_score=-1.0
    )
    try:
        runner.score(_samples(["ok"]))  # wait for the workers to start: not part of the timing
        pids_before = set(runner.worker_pids)
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="failed for 3 of 5 samples"):
            results = runner.score(_samples(["ok", "raise", "hang", "no", "none"]))
        elapsed = time.monotonic() - start
        assert elapsed < 5.0, f"a hanging sample held the batch for {elapsed:.1f}s"
        assert [r.score for r in results] == [1.0, -1.0, -1.0, 0.0, -1.0]
        assert "ZeroDivisionError: user bug" in results[1].error
        assert results[2].error == "timed out after 1s"
        assert "must be a number" in results[4].error
        assert results[0].error is None and results[3].error is None
        assert runner.replaced_workers == 1
        assert set(runner.worker_pids) != pids_before  # the hung worker was killed and replaced

        # The next batch runs normally on the repaired pool.
        start = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = runner.score(_samples(["ok", "no", "ok", "ok"]))
        assert [r.score for r in again] == [1.0, 0.0, 1.0, 1.0]
        assert time.monotonic() - start < 3.0
    finally:
        runner.close()
    assert runner.worker_pids == []


def test_a_function_that_hangs_on_everything_fails_the_rest_at_once(user_file: Path):
    runner = RewardRunner(
        ScorerRef(str(user_file), "flaky"),
        num_workers=2,
        timeout_s=0.5,
        max_consecutive_timeouts=3,
    )
    try:
        runner.score(_samples(["ok"]))  # workers started: not part of the timing
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="failed for 20 of 20 samples"):
            results = runner.score(_samples(["hang"] * 20))
        elapsed = time.monotonic() - start
        # 3 timeouts on 2 workers: about 2 x 0.5 s, not 20 x 0.5 s / 2 workers
        assert elapsed < 3.5, f"20 hanging samples took {elapsed:.1f}s"
        assert sum(r.error == "timed out after 0.5s" for r in results) >= 3
        skipped = [r for r in results if r.error and r.error.startswith("not scored")]
        assert skipped and "seems to hang" in skipped[0].error
    finally:
        runner.close()


def test_a_worker_that_dies_is_reported_and_replaced(user_file: Path):
    with RewardRunner(ScorerRef(str(user_file), "flaky"), num_workers=1, timeout_s=5) as runner:
        with pytest.warns(RuntimeWarning):
            results = runner.score(_samples(["exit", "ok"]))
        assert results[0].error == "the reward worker process died (exit code 3) while scoring"
        assert results[1].score == 1.0
        assert runner.replaced_workers == 1


def test_a_function_that_cannot_load_in_the_worker_is_a_reward_error(tmp_path: Path):
    broken = tmp_path / "broken_reward.py"
    broken.write_text("raise RuntimeError('cannot start')\n")
    with (
        RewardRunner(ScorerRef(str(broken)), num_workers=1) as runner,
        pytest.raises(
            RewardError, match=r"could not load compute_score from .*broken_reward\.py.*start"
        ),
    ):
        runner.score(_samples(["ok"]))


def test_on_error_raise_stops_with_the_sample_named(user_file: Path):
    with (
        RewardRunner(
            ScorerRef(str(user_file), "flaky"), num_workers=1, timeout_s=5, on_error="raise"
        ) as runner,
        pytest.raises(RewardError) as info,
    ):
        runner.score(_samples(["ok", "raise"]))
    text = str(info.value)
    assert "sample 1 (data_source 'mine')" in text
    assert "ZeroDivisionError: user bug" in text
    assert "reward_model.on_error=score" in text


def test_failures_are_logged(user_file: Path, caplog: pytest.LogCaptureFixture):
    scorer = ScorerRef(str(user_file), "flaky")
    with RewardRunner(scorer, num_workers=1, timeout_s=5) as runner, pytest.warns(RuntimeWarning):
        runner.score(_samples(["raise"]))
    assert "sample 0 (data_source 'mine'): ZeroDivisionError" in caplog.text


# ---- in-process -----------------------------------------------------------------------------
def test_in_process_timeout_returns_on_time(user_file: Path):
    runner = RewardRunner(ScorerRef(str(user_file), "flaky"), num_workers=0, timeout_s=0.5)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning):
        results = runner.score(_samples(["hang", "ok"]))
    assert time.monotonic() - start < 3.0
    assert results[0].error.startswith("timed out after 0.5s")
    assert results[1].score == 1.0


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="on_error='ignore'"):
        RewardRunner(ScorerRef(), num_workers=0, on_error="ignore")


# ---- the provider ---------------------------------------------------------------------------
def test_naive_provider_builtin_and_custom(user_file: Path):
    rm = {"num_workers": 1, "timeout_s": 5.0, "failure_score": 0.0, "on_error": "score"}
    provider = NaiveRewardProvider(RewardContext(reward_model=rm, custom_reward_function=None))
    try:
        samples = [
            RewardSample(0, "gsm8k", "so #### 12", "12"),
            RewardSample(1, "polyrl/tiny_digits", "33x3", "3"),
        ]
        results = provider.score(samples)
        assert results[0].score == 1.0
        assert results[1].score == pytest.approx(0.75)
        assert results[1].extra == pytest.approx({"digit_frac": 0.75, "target_frac": 0.75})
        with pytest.warns(RuntimeWarning, match="no built-in scorer"):
            unknown = provider.score([RewardSample(0, "mine", "x", "y")])
        assert "custom_reward_function.path" in unknown[0].error
    finally:
        provider.close()

    custom = {"path": str(user_file), "name": "as_dict"}
    provider = NaiveRewardProvider(RewardContext(reward_model=rm, custom_reward_function=custom))
    try:
        (result,) = provider.score([RewardSample(0, "mine", "abcdef", None)])
        assert result.score == pytest.approx(0.6)
        assert result.extra == {"length": 6.0}
    finally:
        provider.close()

    with pytest.raises(ConfigError, match="no such file"):
        NaiveRewardProvider(
            RewardContext(reward_model=rm, custom_reward_function={"path": "/nonexistent.py"})
        )


def test_builtin_libraries_load_before_the_first_sample_timeout():
    # `import reasoning_gym` takes seconds; workers do it at start-up, outside any sample's
    # timeout, so even a short timeout scores the first reasoning-gym sample.
    entry = {"question": "Calculate 2 + 3.", "answer": "5", "metadata": {}}
    sample = RewardSample(
        0, "reasoning_gym/basic_arithmetic", "<answer>5</answer>", "5", {"entry": entry}
    )
    with RewardRunner(ScorerRef(), num_workers=1, timeout_s=1.0, on_error="raise") as runner:
        assert runner.score([sample])[0].score == 1.0


def test_no_timeout_when_timeout_s_is_zero(user_file: Path):
    with RewardRunner(ScorerRef(str(user_file), "as_float"), num_workers=1, timeout_s=0) as runner:
        assert [r.score for r in runner.score(_samples(["ok", "no"]))] == [1.0, 0.0]
