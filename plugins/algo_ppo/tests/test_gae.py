"""GAE against a hand-worked example and against verl's formula written out per row.

verl (``compute_gae_advantage_return``, 0.9.1) runs the recursion backwards over the response,
carrying the next value and advantage across positions whose mask is 0, takes
``returns = advantages + values`` and whitens the advantages over the mask (unbiased variance,
``eps = 1e-8``). The reference below restates that definition on the list of real positions of
each row, in plain Python floats.
"""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.batch import Batch
from polyrl.testing.configs import algorithm_config
from polyrl_algo_ppo.gae import gae_advantage, gae_advantages_returns


def reference_gae(rewards, values, mask, gamma, lam):
    """Per row: walk the real positions from the last; a masked position takes the advantage
    of the next real one and adds its own value to form the return (as verl does)."""
    rows, length = len(rewards), len(rewards[0])
    advantages = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        next_value = next_advantage = 0.0
        for t in reversed(range(length)):
            if mask[i][t]:
                delta = rewards[i][t] + gamma * next_value - values[i][t]
                next_advantage = delta + gamma * lam * next_advantage
                next_value = values[i][t]
            advantages[i][t] = next_advantage
    returns = [[a + v for a, v in zip(ar, vr)] for ar, vr in zip(advantages, values)]
    real = [advantages[i][t] for i in range(rows) for t in range(length) if mask[i][t]]
    mean = sum(real) / len(real)
    var = sum((a - mean) ** 2 for a in real) / (len(real) - 1)
    whitened = [[(a - mean) / math.sqrt(var + 1e-8) for a in row] for row in advantages]
    return advantages, returns, whitened


def random_inputs(seed: int, rows: int = 6, length: int = 9):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    lengths[0] = length
    mask = (torch.arange(length) < lengths.unsqueeze(1)).float()
    mask[0, 3] = mask[0, 4] = 0.0  # an observation span inside a response (multi-turn)
    rewards = torch.randn(rows, length, generator=gen) * mask
    values = torch.randn(rows, length, generator=gen) * mask
    return rewards, values, mask


def test_hand_worked_example():
    # gamma 0.9, lam 0.5; one response of 3 tokens, outcome reward 1 on the last one.
    # t=2: delta = 1 - 0.5 = 0.5,              A2 = 0.5
    # t=1: delta = 0 + 0.9*0.5 - 0.25 = 0.2,   A1 = 0.2 + 0.45*0.5 = 0.425
    # t=0: delta = 0 + 0.9*0.25 - 0.5 = -0.275, A0 = -0.275 + 0.45*0.425 = -0.08375
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.25, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    advantages, returns = gae_advantages_returns(rewards, values, mask, gamma=0.9, lam=0.5)
    expected = torch.tensor([[-0.08375, 0.425, 0.5, 0.0]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_gamma_and_lam_one_give_the_outcome_minus_the_value():
    rewards, values, mask = random_inputs(0)
    mask[0, 3] = mask[0, 4] = 1.0
    rewards = torch.zeros_like(rewards)
    last = mask.sum(-1).long() - 1
    rewards[torch.arange(len(mask)), last] = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0, 1.0])
    advantages, returns = gae_advantages_returns(rewards, values, mask, gamma=1.0, lam=1.0)
    outcome = rewards.sum(-1, keepdim=True)
    torch.testing.assert_close(advantages * mask, (outcome - values) * mask)
    torch.testing.assert_close(returns * mask, outcome.expand_as(mask) * mask)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_equals_verls_formula_on_random_inputs(gamma, lam, seed):
    rewards, values, mask = random_inputs(seed)
    raw, ret, whitened = reference_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    advantages, returns = gae_advantages_returns(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(advantages, torch.tensor(raw), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(returns, torch.tensor(ret), atol=1e-5, rtol=1e-5)

    batch = Batch({"token_level_rewards": rewards, "values": values, "response_mask": mask})
    adv, rets = gae_advantage(batch, algorithm_config(gamma=gamma, lam=lam))
    real = mask.bool()
    torch.testing.assert_close(adv[real], torch.tensor(whitened)[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rets[real], torch.tensor(ret)[real], atol=1e-5, rtol=1e-5)
    # padding is 0 (verl leaves whatever the arithmetic gives there; no loss reads it)
    assert (adv[~real] == 0).all() and (rets[~real] == 0).all()


def test_the_estimator_reads_gamma_and_lam_from_the_algorithm_node():
    rewards, values, mask = random_inputs(4)
    batch = Batch({"token_level_rewards": rewards, "values": values, "response_mask": mask})
    _, default_returns = gae_advantage(batch, algorithm_config())  # gamma = lam = 1 (verl's)
    _, discounted = gae_advantage(batch, algorithm_config(gamma=0.5, lam=0.5))
    assert not torch.allclose(default_returns, discounted)
