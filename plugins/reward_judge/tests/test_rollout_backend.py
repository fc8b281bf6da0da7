"""The rollout backend on polyrl's tiny model, loaded by name (``hf``) through the registry.
Its weights are random, so its verdicts are garbage: they must be counted as unparsed (with
their reason), never passed off as honest zeros."""

from __future__ import annotations

import pytest
import torch
from judge_testing import judge_context, samples

from polyrl.api import RewardError
from polyrl.api.testing import build_tiny_model
from polyrl_reward_judge.provider import JudgeReward

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("judge")))


def test_garbage_verdicts_are_counted_unparsed(tiny):
    reward = JudgeReward(judge_context(model_path=tiny, max_new_tokens=8, max_unparsed_frac=1.0))
    try:
        replies = reward.backend.judge(["Question: 1+1? Response: 2", "Response: 7"])
        results = reward.score(samples(["2", "7", "I do not know"]))
    finally:
        reward.close()
    assert len(replies) == 2 and all(isinstance(r, str) for r in replies)
    assert len(results) == 3
    for result in results:
        assert result.score == 0.0
        assert result.extra == {"judge_unparsed": 1.0}
        assert result.error == "judge verdict has no score (score_pattern did not match)"


def test_greedy_judging_is_deterministic_and_batched(tiny):
    reward = JudgeReward(judge_context(model_path=tiny, max_new_tokens=8, max_unparsed_frac=1.0))
    try:
        prompts = ["a", "a much longer judge prompt than the first", "a"]
        together = reward.backend.judge(prompts)
        alone = [reward.backend.judge([p])[0] for p in prompts]
    finally:
        reward.close()
    assert together[0] == together[2]
    assert together == alone  # left padding in one generate call changes no reply


def test_the_default_threshold_stops_a_garbage_judge(tiny):
    reward = JudgeReward(judge_context(model_path=tiny, max_new_tokens=8))
    try:
        with pytest.raises(RewardError, match=r"3 of 3 judge verdicts \(100%\)"):
            reward.score(samples(["2", "7", "9"]))
    finally:
        reward.close()
