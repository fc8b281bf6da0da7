"""ReMax, REINFORCE++ and REINFORCE++-baseline against values worked out by hand, and against a
plain-Python, element-by-element reading of verl 0.9.1's formulas on random ragged batches."""

import math
import random
import statistics

import numpy as np
import pytest
import torch

from polyrl.batch import Batch
from polyrl.testing.configs import algorithm_config
from polyrl_algo_reinforce.advantages import (
    reinforce_plus_plus_advantage,
    reinforce_plus_plus_baseline_advantage,
    remax_advantage,
)

torch.set_num_threads(1)
JUNK = 7.0  # what padding holds here: it must never reach an output


def _batch(rewards, mask, **extra):
    batch = Batch(
        {"token_level_rewards": torch.tensor(rewards), "response_mask": torch.tensor(mask)}
    )
    for key, value in extra.items():
        batch[key] = value
    return batch


# ---- hand-worked cases ------------------------------------------------------------------------
def test_remax_returns_to_go_minus_the_greedy_baseline():
    # row 0: rewards [0.2, 0, 1.0] -> returns [1.2, 1.0, 1.0]; baseline 0.4 -> [0.8, 0.6, 0.6]
    # row 1: rewards [0.5, 0.25 | pad] -> returns [0.75, 0.25, 0]; baseline 1.0 -> [-0.25, -0.75, 0]
    batch = _batch(
        [[0.2, 0.0, 1.0], [0.5, 0.25, JUNK]],
        [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]],
        reward_baselines=np.array([0.4, 1.0]),
    )
    adv, returns = remax_advantage(batch, algorithm_config())
    torch.testing.assert_close(returns, torch.tensor([[1.2, 1.0, 1.0], [0.75, 0.25, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.8, 0.6, 0.6], [-0.25, -0.75, 0.0]]))


def test_remax_baseline_may_be_a_tensor_and_must_have_one_value_per_row():
    rewards, mask = [[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 1.0]]
    adv, _ = remax_advantage(
        _batch(rewards, mask, reward_baselines=torch.tensor([0.5, 2.0])), algorithm_config()
    )
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0], [-1.0, -1.0]]))
    with pytest.raises(ValueError, match="reward_baselines has 1 values but the batch has 2"):
        remax_advantage(_batch(rewards, mask, reward_baselines=np.array([0.5])), algorithm_config())


def test_reinforce_plus_plus_discounts_then_whitens_over_the_batch():
    # gamma 0.5. row 0: rewards [0, 0, 1]        -> G = [0.25, 0.5, 1]
    #            row 1: rewards [0, 2 | pad junk] -> G = [1, 2, 0 (padding)]
    # the 5 response tokens: mean 4.75 / 5 = 0.95; squared deviations sum to 1.8,
    # unbiased var 1.8 / 4 = 0.45 -> A = (G - 0.95) / sqrt(0.45 + 1e-8)
    batch = _batch([[0.0, 0.0, 1.0], [0.0, 2.0, JUNK]], [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, returns = reinforce_plus_plus_advantage(batch, algorithm_config(gamma=0.5))
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    std = math.sqrt(0.45 + 1e-8)
    expected = [[-0.7 / std, -0.45 / std, 0.05 / std], [0.05 / std, 1.05 / std, 0.0]]
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_reinforce_plus_plus_reads_gamma():
    batch = _batch([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    _, undiscounted = reinforce_plus_plus_advantage(batch, algorithm_config(gamma=1.0))
    _, discounted = reinforce_plus_plus_advantage(batch, algorithm_config(gamma=0.9))
    torch.testing.assert_close(undiscounted[0], torch.tensor([1.0, 1.0, 1.0]))
    torch.testing.assert_close(discounted[0], torch.tensor([0.81, 0.9, 1.0]))


def test_reinforce_plus_plus_baseline_centres_by_group_then_whitens():
    # groups a = rows 0, 1 (scores 1, 0 -> centred +0.5, -0.5), b = rows 2, 3 (2, 0 -> +1, -1);
    # lengths 2, 1, 1, 2: the token values are [.5, .5, -.5, 1, -1, -1], whitened together
    uid = np.array(["a", "a", "b", "b"], dtype=object)
    batch = _batch(
        [[0.0, 1.0], [0.0, JUNK], [2.0, JUNK], [0.0, 0.0]],
        [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]],
        uid=uid,
    )
    adv, returns = reinforce_plus_plus_baseline_advantage(batch, algorithm_config())
    tokens = [0.5, 0.5, -0.5, 1.0, -1.0, -1.0]
    mean, var = statistics.fmean(tokens), statistics.variance(tokens)  # variance is unbiased
    w = [(v - mean) / math.sqrt(var + 1e-8) for v in tokens]
    expected = torch.tensor([[w[0], w[1]], [w[2], 0.0], [w[3], 0.0], [w[4], w[5]]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(returns, adv)


def test_reinforce_plus_plus_baseline_keeps_a_singleton_group_neutral():
    uid = np.array(["a", "a", "solo"], dtype=object)
    batch = _batch([[1.0], [0.0], [5.0]], [[1.0], [1.0], [1.0]], uid=uid)
    adv, _ = reinforce_plus_plus_baseline_advantage(batch, algorithm_config())
    # centred values [0.5, -0.5, 0]: mean 0, unbiased var 0.25 -> [1, -1, 0] (up to the 1e-8)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -1.0, 0.0]), atol=1e-6, rtol=0)


# ---- verl 0.9.1's formulas, element by element -----------------------------------------------
def _verl_masked_mean(values, mask):
    """verl_F.masked_mean: sum(values * mask) / (sum(mask) + 1e-8)."""
    total = sum(v * m for row, mrow in zip(values, mask) for v, m in zip(row, mrow))
    return total / (sum(sum(r) for r in mask) + 1e-8)


def _verl_masked_whiten(values, mask):
    """verl_F.masked_whiten: (x - mean) * rsqrt(unbiased masked var + 1e-8)."""
    mean = _verl_masked_mean(values, mask)
    var = _verl_masked_mean([[(v - mean) ** 2 for v in row] for row in values], mask)
    count = sum(sum(r) for r in mask)
    var *= count / (count - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in values]


def _verl_reinforce_plus_plus(rewards, mask, gamma):
    returns = []
    for row, mrow in zip(rewards, mask):
        out, running = [0.0] * len(row), 0.0
        for t in reversed(range(len(row))):
            running = row[t] + gamma * running
            out[t] = running
            running *= mrow[t]
        returns.append(out)
    whitened = _verl_masked_whiten(returns, mask)
    return [[a * m for a, m in zip(r, mr)] for r, mr in zip(whitened, mask)], returns


def _verl_reinforce_plus_plus_baseline(rewards, mask, index):
    scores = [sum(row) for row in rewards]
    groups = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(scores[i])
    centred = [s - statistics.fmean(groups[g]) for s, g in zip(scores, index)]
    tiled = [[c * m for m in mrow] for c, mrow in zip(centred, mask)]
    whitened = _verl_masked_whiten(tiled, mask)
    return [[a * m for a, m in zip(r, mr)] for r, mr in zip(whitened, mask)]


def _verl_remax(rewards, mask, baselines):
    returns, advantages = [], []
    for row, mrow, b in zip(rewards, mask, baselines):
        masked = [r * m for r, m in zip(row, mrow)]
        ret = [sum(masked[t:]) for t in range(len(row))]
        returns.append(ret)
        advantages.append([g - b * m for g, m in zip(ret, mrow)])
    return advantages, returns


def _random_batch(seed, groups=4, per_group=3, width=6, dense=False):
    """Ragged responses in groups; an outcome reward on the last token, or (dense) a reward on
    every token; padding holds zeros, as in a real batch."""
    rnd = random.Random(seed)
    rows = groups * per_group
    lengths = [rnd.randint(1, width) for _ in range(rows)]
    lengths[0] = width
    mask = [[1.0 if t < n else 0.0 for t in range(width)] for n in lengths]
    rewards = []
    for n in lengths:
        row = [0.0] * width
        if dense:
            row[:n] = [rnd.gauss(0, 1) for _ in range(n)]
        else:
            row[n - 1] = rnd.choice([0.0, 0.5, 1.0]) + rnd.gauss(0, 0.2)
        rewards.append(row)
    index = [f"g{i // per_group}" for i in range(rows)]
    order = list(range(rows))
    rnd.shuffle(order)  # rows of a group need not be contiguous
    return (
        [rewards[i] for i in order],
        [mask[i] for i in order],
        [index[i] for i in order],
        [rnd.gauss(0.5, 0.3) for _ in range(rows)],
    )


def _close(got, expected, rel=1e-5, abs_=1e-5):
    for g_row, e_row in zip(got.tolist(), expected):
        assert g_row == pytest.approx(e_row, rel=rel, abs=abs_)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("dense", [False, True])
def test_reinforce_plus_plus_equals_verl(seed, gamma, dense):
    rewards, mask, _, _ = _random_batch(seed, dense=dense)
    adv, returns = reinforce_plus_plus_advantage(
        _batch(rewards, mask), algorithm_config(gamma=gamma)
    )
    expected_adv, expected_returns = _verl_reinforce_plus_plus(rewards, mask, gamma)
    _close(adv, expected_adv)
    _close(returns, expected_returns)


@pytest.mark.parametrize("seed", range(4))
def test_reinforce_plus_plus_baseline_equals_verl(seed):
    rewards, mask, index, _ = _random_batch(seed)
    batch = _batch(rewards, mask, uid=np.array(index, dtype=object))
    adv, returns = reinforce_plus_plus_baseline_advantage(batch, algorithm_config())
    expected = _verl_reinforce_plus_plus_baseline(rewards, mask, index)
    _close(adv, expected)
    _close(returns, expected)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dense", [False, True])
def test_remax_equals_verl(seed, dense):
    rewards, mask, _, baselines = _random_batch(seed, dense=dense)
    batch = _batch(rewards, mask, reward_baselines=np.array(baselines))
    adv, returns = remax_advantage(batch, algorithm_config())
    expected_adv, expected_returns = _verl_remax(rewards, mask, baselines)
    _close(adv, expected_adv)
    _close(returns, expected_returns)


# ---- registration ---------------------------------------------------------------------------
def test_registered_through_the_entry_point(monkeypatch):
    from polyrl.registry import discover
    from polyrl.specs import PluginKind

    monkeypatch.setenv("POLYRL_PLUGINS", "polyrl-algo-reinforce,polyrl-algo-grpo")
    registry = discover()
    expected = {
        "remax": (remax_advantage, {"token_level_rewards", "response_mask", "reward_baselines"}),
        "reinforce_plus_plus": (
            reinforce_plus_plus_advantage,
            {"token_level_rewards", "response_mask"},
        ),
        "reinforce_plus_plus_baseline": (
            reinforce_plus_plus_baseline_advantage,
            {"token_level_rewards", "response_mask", "uid"},
        ),
    }
    for name, (fn, requires) in expected.items():
        reg = registry.get(PluginKind.ADVANTAGE_ESTIMATOR, name)
        assert reg.provenance.distribution == "polyrl-algo-reinforce"
        assert reg.load() is fn and set(reg.spec.requires) == requires
        algorithm = registry.get(PluginKind.ALGORITHM, name)
        assert algorithm.spec.estimators == (name,)
    assert registry.get(
        PluginKind.ADVANTAGE_ESTIMATOR, "reinforce_plus_plus_baseline"
    ).spec.requires_groups


def test_the_estimator_selects_its_algorithm():
    from polyrl.api import build_pipeline
    from polyrl.config.loader import load_config

    cfg = load_config(["recipe=tiny", "algorithm.adv_estimator=remax"])
    assert build_pipeline(cfg).names()[:2] == ["gen_max", "gen"]
    cfg = load_config(["recipe=tiny", "algorithm.adv_estimator=reinforce_plus_plus"])
    assert build_pipeline(cfg).names()[0] == "gen"
