"""The rollout backend: the ``judge`` worker role on polyrl's tiny model (its rollout engine
loaded from the worker plan, here ``hf``), reached by the provider through the driver's handle on
the workers. The role and its engine are real and built in this process; the handle is
``ScriptedRoles`` answering ``judge.judge`` with that role (Ray is the end-to-end tests' part).
The tiny model's weights are random, so its verdicts are garbage: they must be counted as
unparsed (with their reason), never passed off as honest zeros. Where the role is placed is the
run plan's business, checked here on assembled plans."""

from __future__ import annotations

import pytest
import torch
from judge_testing import judge_context, judge_role, on_role, samples

from polyrl.api import RewardError, assemble, resolve_model_path
from polyrl.config.loader import load_config
from polyrl_reward_judge.plugin import judge_roles
from polyrl_reward_judge.provider import JudgeReward
from polyrl_reward_judge.role import JudgeRole

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def role():
    judge = judge_role(model_path=resolve_model_path("builtin:tiny"), max_new_tokens=8)
    yield judge
    judge.shutdown()


def attached(role: JudgeRole, *, dp_size: int = 1, **settings) -> tuple[JudgeReward, list]:
    return on_role(role, dp_size=dp_size, model_path="unused", max_new_tokens=8, **settings)


def test_garbage_verdicts_are_counted_unparsed(role):
    reward, _ = attached(role, max_unparsed_frac=1.0)
    results = reward.score(samples(["2", "7", "I do not know"]))
    assert len(results) == 3
    for result in results:
        assert result.score == 0.0
        assert result.extra == {"judge_unparsed": 1.0}
        assert result.error == "judge verdict has no score (score_pattern did not match)"


def test_batched_replies_equal_single_ones_and_padding_is_dropped(role):
    reward, received = attached(role, dp_size=2, max_unparsed_frac=1.0)
    prompts = ["a", "a much longer judge prompt than the first", "a"]
    together = reward.backend.judge(prompts)
    assert len(received[0]) == 4  # padded to a multiple of the role's 2 data-parallel ranks
    alone = [reward.backend.judge([p])[0] for p in prompts]
    assert len(together) == 3 and all(isinstance(r, str) for r in together)
    assert together[0] == together[2]
    assert together == alone  # left padding in one generate call changes no reply


def test_the_default_threshold_stops_a_garbage_judge(role):
    reward, _ = attached(role)
    with pytest.raises(RewardError, match=r"3 of 3 judge verdicts \(100%\)"):
        reward.score(samples(["2", "7", "9"]))


def test_without_workers_the_rollout_backend_says_why():
    reward = JudgeReward(judge_context(model_path="unused"))
    with pytest.raises(RewardError, match="the judge role has no workers"):
        reward.score(samples(["2"]))


JUDGE = ("recipe=tiny", "reward_model.reward_manager=judge", "reward_model.judge.model_path=m")


def test_the_judge_role_shares_the_actors_pool_unless_given_its_own():
    plan = assemble(load_config(list(JUDGE)))
    assert plan.pools["global"] == (2, ("rollout", "actor", "ref", "judge"))
    assert plan.worker_plan().role_classes["judge"] == "polyrl_reward_judge.role:JudgeRole"
    own = [*JUDGE, "trainer.role_pools.judge=judge_pool", "trainer.resource_pools.judge_pool=1"]
    plan = assemble(load_config(own))
    assert plan.pools["global"] == (2, ("rollout", "actor", "ref"))
    assert plan.pools["judge_pool"] == (1, ("judge",))


def test_the_openai_backend_has_no_role():
    cfg = load_config([*JUDGE, "reward_model.judge.backend=openai"])
    assert judge_roles(cfg) == {}
    assert "judge" not in assemble(cfg, check=False).pipeline.roles()
