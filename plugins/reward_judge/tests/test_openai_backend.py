"""The openai backend against a loopback /v1/chat/completions server, through the real
``openai`` client: scores, the concurrency limit, timeouts, and the unparsed threshold."""

from __future__ import annotations

import time

import pytest
from judge_testing import judge_context, samples

from polyrl.api import ConfigError, RewardError
from polyrl_reward_judge.provider import JudgeReward


def judge(server, monkeypatch, **values) -> JudgeReward:
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test")
    settings = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": "judge",
        "api_key_env": "JUDGE_TEST_KEY",
        "template": "{response}",
        **values,
    }
    return JudgeReward(judge_context(**settings))


def test_scores_and_empty_step(judge_server, monkeypatch):
    reward = judge(judge_server, monkeypatch)
    results = reward.score(samples(["say:Score: 7", "say:Score: 0", "say:Score: 10"]))
    assert [r.score for r in results] == pytest.approx([0.7, 0.0, 1.0])
    assert all(r.error is None and r.extra == {"judge_unparsed": 0.0} for r in results)
    assert reward.score([]) == []


def test_concurrency_never_exceeds_the_limit(judge_server, monkeypatch):
    reward = judge(judge_server, monkeypatch, max_concurrency=3)
    results = reward.score(samples([f"say:Score: {i % 11}" for i in range(12)]))
    assert [r.score for r in results] == pytest.approx([(i % 11) / 10 for i in range(12)])
    assert judge_server.requests == 12
    assert judge_server.peak == 3  # the limit is reached (requests overlap) and never passed


def test_a_slow_answer_times_out_and_is_counted(judge_server, monkeypatch):
    reward = judge(judge_server, monkeypatch, timeout_s=0.5, max_unparsed_frac=0.5)
    start = time.monotonic()
    results = reward.score(samples(["say:Score: 5", "slow:say:Score: 9", "say:Score: 1"]))
    assert time.monotonic() - start < 2.5  # not the server's 3 s
    assert [r.score for r in results] == pytest.approx([0.5, 0.0, 0.1])
    slow = results[1]
    assert slow.error == "judge request timed out after 0.5s"
    assert slow.extra == {"judge_unparsed": 1.0}
    assert [r.extra["judge_unparsed"] for r in results] == [0.0, 1.0, 0.0]


def test_unparsed_verdicts_are_counted_below_the_threshold(judge_server, monkeypatch):
    reward = judge(judge_server, monkeypatch, max_unparsed_frac=0.5)
    results = reward.score(samples(["say:Score: 4", "say:looks fine to me"]))
    assert results[0].score == pytest.approx(0.4) and results[0].error is None
    assert results[1].score == 0.0
    assert results[1].error == "judge verdict has no score (score_pattern did not match)"
    assert results[1].extra == {"judge_unparsed": 1.0}


def test_too_many_unparsed_verdicts_stop_the_step(judge_server, monkeypatch):
    reward = judge(judge_server, monkeypatch, max_unparsed_frac=0.5)
    garbage = "say:" + "blah " * 100
    with pytest.raises(RewardError) as err:
        reward.score(samples(["say:Score: 4", garbage, garbage]))
    message = str(err.value)
    assert "2 of 3 judge verdicts (67%)" in message
    assert "reward_model.judge.max_unparsed_frac=0.5" in message
    assert repr(("blah " * 100)[:200]) in message and "blah " * 41 not in message


def test_a_missing_key_variable_is_one_line(monkeypatch):
    monkeypatch.delenv("JUDGE_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"JUDGE_MISSING_KEY.*not set"):
        JudgeReward(
            judge_context(
                backend="openai",
                base_url="http://127.0.0.1:1/v1",
                model="m",
                api_key_env="JUDGE_MISSING_KEY",
            )
        )


def test_an_unreachable_server_is_an_unparsed_verdict(monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test")
    reward = JudgeReward(
        judge_context(
            backend="openai",
            base_url="http://127.0.0.1:1/v1",
            model="m",
            api_key_env="JUDGE_TEST_KEY",
            max_unparsed_frac=1.0,
        )
    )
    (result,) = reward.score(samples(["Score: 3"]))
    assert result.score == 0.0 and result.error == "judge request failed (APIConnectionError)"
