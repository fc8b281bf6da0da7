"""verl's optimal token baselines against values worked out by hand from verl's formulas:
``w = 1 - 2 exp(old_log_prob) + sum_pi_squared`` per token (times the squared rollout
importance weight when the batch has one), ``W`` its running sum, the baseline of a position
``sum_i G_i W_i / (sum_i W_i + 1e-8)`` over the group, zero past the second-longest length on a
strictly longest trajectory, and no baseline for a group of one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from polyrl.api import Batch
from polyrl.api.testing import schema_config
from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config
from polyrl_algo_grpo.optimal_token_baseline import (
    optimal_token_baseline_advantage,
    tir_optimal_token_baseline_advantage,
)

torch.set_num_threads(1)


def _batch(mask, rewards, pi, squares, uid) -> Batch:
    """Rows of per-token ``pi`` (the sampled token's old probability) and ``sum_pi_squared``,
    each constant along its row."""
    mask = torch.tensor(mask, dtype=torch.float32)
    rows, width = mask.shape
    batch = Batch(
        {
            "response_mask": mask,
            "token_level_rewards": torch.tensor(rewards, dtype=torch.float32),
            "old_log_probs": torch.log(torch.tensor(pi)).unsqueeze(-1).expand(rows, width) * mask,
            "sum_pi_squared": torch.tensor(squares).unsqueeze(-1).expand(rows, width) * mask,
        }
    )
    batch["uid"] = np.array(uid, dtype=object)
    return batch


# Group "a": three responses of lengths 3, 2, 1 with w = 1 - 2 pi + sum_pi_squared of
# 1 - 1 + 0.5 = 0.5, 1 - 0.5 + 0.5 = 1 and 1 - 1.5 + 0.75 = 0.25 per token, so W = (0.5, 1,
# 1.5), (1, 2) and (0.25); rewards 1, 0.5 and 2 on their last tokens, so the returns-to-go are
# G = (1, 1, 1), (0.5, 0.5) and (2). Group "b": one response of length 2, reward 1.
MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]]
REWARDS = [[0, 0, 1], [0, 0.5, 0], [2, 0, 0], [0, 1, 0]]
PI = [0.5, 0.25, 0.75, 0.5]
SQUARES = [0.5, 0.5, 0.75, 0.5]
UID = ["a", "a", "a", "b"]
RETURNS = [[1, 1, 1], [0.5, 0.5, 0], [2, 0, 0], [1, 1, 0]]


def _eps(num: float, den: float) -> float:
    return num / (den + 1e-8)


def test_optimal_token_baseline_by_hand():
    # position 0: (1 x 0.5 + 0.5 x 1 + 2 x 0.25) / (0.5 + 1 + 0.25) = 1.5 / 1.75
    # position 1: (1 x 1 + 0.5 x 2) / (1 + 2) = 2 / 3
    # position 2: only the longest (3 > 2): its tail past length 2 gets baseline 0
    b0, b1 = _eps(1.5, 1.75), _eps(2.0, 3.0)
    expected = [
        [1 - b0, 1 - b1, 1 - 0],
        [0.5 - b0, 0.5 - b1, 0],
        [2 - b0, 0, 0],
        [1, 1, 0],  # a group of one keeps its returns
    ]
    adv, returns = optimal_token_baseline_advantage(
        _batch(MASK, REWARDS, PI, SQUARES, UID), schema_config().algorithm
    )
    torch.testing.assert_close(returns, torch.tensor(RETURNS, dtype=torch.float32))
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float32))
    assert b0 == pytest.approx(6 / 7) and b1 == pytest.approx(2 / 3)


def test_rollout_importance_weights_scale_the_path_variance():
    # the second response's tokens weighted 2: w = 1 x 2^2 = 4, W = (4, 8)
    batch = _batch(MASK, REWARDS, PI, SQUARES, UID)
    batch["rollout_is_weights"] = torch.tensor([[1.0, 1, 1], [2, 2, 2], [1, 1, 1], [1, 1, 1]])
    b0 = _eps(1 * 0.5 + 0.5 * 4 + 2 * 0.25, 0.5 + 4 + 0.25)  # 3 / 4.75
    b1 = _eps(1 * 1 + 0.5 * 8, 1 + 8)  # 5 / 9
    adv, _ = optimal_token_baseline_advantage(batch, schema_config().algorithm)
    torch.testing.assert_close(adv[:2, :2], torch.tensor([[1 - b0, 1 - b1], [0.5 - b0, 0.5 - b1]]))


def test_equal_lengths_keep_the_whole_baseline():
    # two responses of length 2 in one group: no zero tail
    batch = _batch([[1, 1], [1, 1]], [[0, 1], [0, 0]], [0.5, 0.5], [0.5, 0.5], ["a", "a"])
    adv, _ = optimal_token_baseline_advantage(batch, schema_config().algorithm)
    # w = 0.5 for both, W = (0.5, 1): baseline = the mean return 0.5 at both positions
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [-0.5, -0.5]]), atol=1e-7, rtol=0)


# Multi-turn: the first response's middle token is a tool output (masked out). Its own tokens
# are positions 0 and 2, with w = 0.5 each (W = 0.5 then 1.0) and a return of 1 at both; the
# second response's are positions 0 and 1 with w = 1 (W = 1, 2) and a return of 0.5.
TIR_MASK = [[1, 0, 1], [1, 1, 0]]
TIR_REWARDS = [[0, 0, 1], [0, 0.5, 0]]
TIR_PI, TIR_SQUARES = [0.5, 0.25], [0.5, 0.5]


def test_tir_compares_the_kth_own_token_across_the_group():
    batch = _batch(TIR_MASK, TIR_REWARDS, TIR_PI, TIR_SQUARES, ["a", "a"])
    # own-token 0: (1 x 0.5 + 0.5 x 1) / 1.5; own-token 1: (1 x 1 + 0.5 x 2) / 3; equal lengths
    b0, b1 = _eps(1.0, 1.5), _eps(2.0, 3.0)
    adv, returns = tir_optimal_token_baseline_advantage(batch, schema_config().algorithm)
    torch.testing.assert_close(adv, torch.tensor([[1 - b0, 0, 1 - b1], [0.5 - b0, 0.5 - b1, 0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1, 1], [0.5, 0.5, 0]]))
    # the column-wise estimator compares column 1 (a tool output in the first) instead: there
    # only the second response counts, baseline 0.5 x 2 / 2 = 0.5
    adv, _ = optimal_token_baseline_advantage(batch, schema_config().algorithm)
    torch.testing.assert_close(adv[1, 1], torch.tensor(0.5 - _eps(1.0, 2.0)))


def test_tir_leaves_empty_responses_out_of_their_group():
    # an empty response beside a single real one: the real one is a group of one (its returns)
    batch = _batch([[1, 1], [0, 0]], [[0, 1], [0, 0]], [0.5, 0.5], [0.5, 0.5], ["a", "a"])
    adv, _ = tir_optimal_token_baseline_advantage(batch, schema_config().algorithm)
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0], [0, 0]]))
    assert math.isfinite(float(adv.sum()))


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_selectable_by_verls_name_with_sum_pi_squared_on(name):
    cfg = load_config(["recipe=tiny", f"algorithm.adv_estimator={name}"])
    assert validate_config(cfg) == []
    assert cfg.actor_rollout_ref.actor.calculate_sum_pi_squared is True


def test_sum_pi_squared_turned_off_is_named():
    cfg = load_config(
        [
            "recipe=tiny",
            "algorithm.adv_estimator=optimal_token_baseline",
            "actor_rollout_ref.actor.calculate_sum_pi_squared=false",
        ]
    )
    problems = validate_config(cfg)
    assert any("calculate_sum_pi_squared=true (as in verl): set it" in p for p in problems)
