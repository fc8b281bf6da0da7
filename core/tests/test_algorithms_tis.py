"""Truncated importance sampling: weights and metrics against hand-derived values, and the
actor loss that applies them."""

import math

import pytest
import torch

from polyrl.algorithms import make_actor_loss_fn, vanilla_policy_loss
from polyrl.algorithms.tis import truncated_is_weights
from polyrl.batch import Batch
from polyrl.testing.configs import actor_config

torch.set_num_threads(1)

log = math.log


def test_weights_are_the_ratio_truncated_at_the_cap() -> None:
    # pi_old / pi_rollout per token: 0.5/0.25 = 2 (over the cap 1.5), 0.3/0.6 = 0.5, 0.2/0.2 = 1,
    # and a padding token whose ratio (e^10) must count in no metric.
    old = torch.tensor([[log(0.5), log(0.3)], [log(0.2), 0.0]])
    rollout = torch.tensor([[log(0.25), log(0.6)], [log(0.2), -10.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    weights, metrics = truncated_is_weights(old, rollout, mask, cap=1.5)
    expected = torch.tensor([[1.5, 0.5], [1.0, 1.5]])
    assert torch.allclose(weights, expected, atol=1e-6)
    assert not weights.requires_grad
    assert metrics["tis_weight_mean"].item() == pytest.approx((1.5 + 0.5 + 1.0) / 3)
    assert metrics["tis_clipfrac"].item() == pytest.approx(1 / 3)


def test_on_policy_samples_get_weight_one() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    weights, metrics = truncated_is_weights(logp, logp.clone(), torch.ones(1, 3), cap=2.0)
    assert torch.equal(weights, torch.ones(1, 3))
    assert metrics["tis_clipfrac"].item() == 0.0


def test_actor_loss_weights_each_tokens_policy_loss() -> None:
    # On-policy for the trainer (log_prob == old_log_probs): the PPO loss is -A per token, and
    # the TIS weight min(pi_old / pi_rollout, 2) multiplies it: 2 (ratio 4, capped), 0.5, 1.
    old = torch.tensor([[log(0.4), log(0.1), log(0.3)]])
    rollout = torch.tensor([[log(0.1), log(0.2), log(0.3)]])
    batch = Batch(
        {
            "old_log_probs": old,
            "rollout_log_probs": rollout,
            "advantages": torch.tensor([[1.0, 2.0, -1.0]]),
            "response_mask": torch.ones(1, 3),
        }
    )
    loss_fn = make_actor_loss_fn(actor_config(tis_imp_ratio_cap=2.0), vanilla_policy_loss)
    log_prob = old.clone().requires_grad_(True)
    loss, metrics = loss_fn(batch, log_prob, None)
    # token-mean of (-1 * 2, -2 * 0.5, 1 * 1) = (-2 - 1 + 1) / 3
    assert loss.item() == pytest.approx(-2 / 3, abs=1e-6)
    assert metrics["actor/tis_weight_mean"] == pytest.approx((2 + 0.5 + 1) / 3)
    assert metrics["actor/tis_clipfrac"] == pytest.approx(1 / 3)
    # The weight is a constant: d loss / d log_prob = -A * w * r / 3 with r = 1.
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[-2.0, -1.0, 1.0]]) / 3, atol=1e-6)
