"""Decoupled PPO on the hand-made batch of zoo_inputs, with behaviour probabilities chosen by
hand: each token's loss worked out below, the gradient of an unclipped token, the cap, the
metrics, the conformance suite, and the config checks."""

from __future__ import annotations

import math
import re

import pytest
import torch
from omegaconf import OmegaConf
from zoo_inputs import actor_node, batch_and_log_prob

from polyrl.api.testing import PolicyLossConformance, schema_config
from polyrl_loss_zoo.decoupled import check_decoupled_config, decoupled_ppo_policy_loss

# pi_behav per token (the rollout's sampling probabilities); zoo_inputs' OLD_P is pi_prox and
# NEW_P the policy being trained.
BEHAV_P = [[0.4, 0.2, 0.9], [0.6, 0.6, 0.0], [0.001, 0.0, 0.0]]

# By hand, clip_ratio 0.2, loss = w * max(-A r, -A clip(r, 0.8, 1.2)), w = pi_prox / pi_behav:
#   (0,0) r = .65/.5 = 1.3,  A = 1.5:  max(-1.95, -1.8) = -1.8 (clipped),  w = .5/.4 = 1.25
#   (0,1) r = .1/.2 = 0.5:             max(-0.75, -1.2) = -0.75,           w = 1
#   (0,2) r = .95/.9:                  -1.5 * .95/.9 = -1.58333,           w = 1
#   (1,0) r = .45/.3 = 1.5,  A = -0.8: max(1.2, 0.96) = 1.2,               w = .3/.6 = 0.5
#   (1,1) r = .5/.6 = 0.8333:          0.8 * 0.8333 = 0.66667,             w = 1
#   (2,0) r = .3/.05 = 6,    A = 0.7:  max(-4.2, -0.84) = -0.84 (clipped), w = .05/.001 = 50
HAND = [[1.25 * -1.8, -0.75, -1.5 * 0.95 / 0.9], [0.5 * 1.2, 0.8 * 0.5 / 0.6, 0.0]]


def batch_with_behaviour():
    batch, log_prob = batch_and_log_prob()
    mask = batch["response_mask"]
    batch["rollout_log_probs"] = torch.log(torch.tensor(BEHAV_P).clamp_min(1e-30)) * mask
    return batch, log_prob


def test_each_token_is_the_clipped_surrogate_times_the_behaviour_weight() -> None:
    batch, log_prob = batch_with_behaviour()
    loss, metrics = decoupled_ppo_policy_loss(batch, log_prob, actor_node())
    expected = torch.tensor([*HAND, [50 * -0.84, 0.0, 0.0]])
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-5)
    assert float(metrics["pg_clipfrac"]) == pytest.approx(2 / 6)
    assert float(metrics["behav_capped_frac"]) == 0.0
    assert float(metrics["behav_weight_mean"]) == pytest.approx((1.25 + 3 + 0.5 + 50) / 6)
    # d loss / d log pi of an unclipped token: w * (-A r) = 0.5 * 0.8 * 1.5; a clipped one: 0
    loss.sum().backward()
    assert float(log_prob.grad[1, 0]) == pytest.approx(0.6, rel=1e-5)
    assert float(log_prob.grad[0, 0]) == 0.0


def test_tokens_over_the_cap_are_left_out() -> None:
    batch, log_prob = batch_with_behaviour()
    cfg = actor_node(policy_loss={"behav_imp_weight_cap": 5.0})
    loss, metrics = decoupled_ppo_policy_loss(batch, log_prob, cfg)
    torch.testing.assert_close(loss.detach(), torch.tensor([*HAND, [0.0, 0.0, 0.0]]))
    assert float(metrics["behav_capped_frac"]) == pytest.approx(1 / 6)
    assert float(metrics["behav_weight_mean"]) == pytest.approx(4.75 / 6)
    behav_kl = (math.log(1.25) + math.log(0.5) + math.log(50)) / 6
    assert float(metrics["behav_kl"]) == pytest.approx(behav_kl, rel=1e-5)


def test_on_policy_samples_give_plain_ppo() -> None:
    batch, log_prob = batch_with_behaviour()
    batch["rollout_log_probs"] = batch["old_log_probs"].clone()
    loss, metrics = decoupled_ppo_policy_loss(batch, log_prob, actor_node())
    loss = loss.detach()
    assert float(loss[0, 0]) == pytest.approx(-1.8) and float(loss[1, 0]) == pytest.approx(1.2)
    assert float(metrics["behav_weight_mean"]) == pytest.approx(1.0)


class TestDecoupledPpoConformance(PolicyLossConformance):
    plugin_name = "decoupled_ppo"

    def loss_config(self):
        return actor_node(**self.config_overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy_loss": {"behav_imp_weight_cap": 0.5}}, "behav_imp_weight_cap=0.5 must be"),
        ({"tis_imp_ratio_cap": 2.0}, "correct a second time: set .*tis_imp_ratio_cap=-1"),
    ],
)
def test_config_check_refuses_a_bad_cap_and_tis_on_top(overrides, message) -> None:
    cfg = schema_config()
    cfg.actor_rollout_ref.actor = OmegaConf.merge(cfg.actor_rollout_ref.actor, overrides)
    problems = check_decoupled_config(cfg)
    assert len(problems) == 1 and re.search(message, problems[0]), problems
    assert check_decoupled_config(schema_config()) == []
