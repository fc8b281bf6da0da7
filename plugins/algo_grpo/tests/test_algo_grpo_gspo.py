"""The GSPO policy loss against values worked out by hand, and against the gradient of the
sequence-level objective written directly."""

import math

import pytest
import torch

from polyrl.algorithms import agg_loss
from polyrl.batch import Batch
from polyrl.testing.configs import actor_config
from polyrl_algo_grpo.gspo import gspo_policy_loss

torch.set_num_threads(1)

CFG = actor_config()  # clip_ratio 0.2, low and high falling back to it
# Token log-ratios (log pi - log pi_old); 9.0 marks padding.
#   row 0, A=+1: [0.2, 0.0]      mean 0.1  -> s = e^0.1 = 1.1051709 (inside [0.8, 1.2])
#   row 1, A=+1: [0.6, 0.2, 0.4] mean 0.4  -> s = e^0.4 = 1.4918247 -> clipped to 1.2
#   row 2, A=-1: [-0.5, -0.3]    mean -0.4 -> s = e^-0.4 = 0.6703200 -> max(0.67, 0.8) = 0.8
LOG_RATIO = torch.tensor([[0.2, 0.0, 9.0], [0.6, 0.2, 0.4], [-0.5, -0.3, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]) * MASK
OLD = torch.full((3, 3), -1.5)


def _loss(log_prob, cfg=CFG):
    batch = Batch({"old_log_probs": OLD, "advantages": ADV, "response_mask": MASK})
    return gspo_policy_loss(batch, log_prob, cfg)


def test_values_and_metrics():
    loss_mat, metrics = _loss(OLD + LOG_RATIO)
    s0 = math.exp(0.1)
    expected = torch.tensor([[-s0, -s0, 0.0], [-1.2, -1.2, -1.2], [0.8, 0.8, 0.0]])
    torch.testing.assert_close(loss_mat, expected, rtol=1e-5, atol=1e-6)
    # rows 1 and 2 clipped: (3 + 2) of 7 tokens
    assert float(metrics["pg_clipfrac"]) == pytest.approx(5 / 7)
    assert float(metrics["pg_clipfrac_lower"]) == 0.0  # no dual clip in GSPO
    # -(0.2 + 0 + 0.6 + 0.2 + 0.4 - 0.5 - 0.3) / 7 = -0.6 / 7
    assert float(metrics["ppo_kl"]) == pytest.approx(-0.6 / 7, rel=1e-5)


def test_token_gradient_of_unclipped_sequence():
    # row 0: d/dlogp_t of -A * s0 * exp(logp_t - sg(logp_t)) = -s0 per token; with
    # seq-mean-token-mean over G=3 rows and |y_0| = 2 tokens: -s0 / 6 = -0.1841952.
    # Clipped rows have no gradient.
    log_prob = (OLD + LOG_RATIO).requires_grad_(True)
    loss_mat, _ = _loss(log_prob)
    agg_loss(loss_mat, MASK, "seq-mean-token-mean").backward()
    g = -math.exp(0.1) / 6
    expected = torch.tensor([[g, g, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(log_prob.grad, expected, rtol=1e-5, atol=1e-7)
    assert g == pytest.approx(-0.1841952, rel=1e-6)


def test_matches_the_sequence_level_objective_when_nothing_is_clipped():
    # With a wide clip range, GSPO's objective is J = 1/G sum_i A_i s_i with
    # s_i = exp(mean_t(logp - old)). Its gradient must equal the token form's.
    wide = actor_config(clip_ratio=10.0, clip_ratio_low=0.99, clip_ratio_high=10.0)
    direct_lp = (OLD + LOG_RATIO).requires_grad_(True)
    m = MASK.float()
    seq = ((direct_lp - OLD) * m).sum(-1) / m.sum(-1)
    (-(ADV[:, 0] * torch.exp(seq)).mean()).backward()

    token_lp = (OLD + LOG_RATIO).requires_grad_(True)
    loss_mat, metrics = _loss(token_lp, cfg=wide)
    agg_loss(loss_mat, MASK, "seq-mean-token-mean").backward()
    assert float(metrics["pg_clipfrac"]) == 0.0
    torch.testing.assert_close(token_lp.grad, direct_lp.grad)


def test_gradient_direction():
    # on-policy: s = 1, nothing clipped; descent raises positive-advantage tokens
    log_prob = OLD.clone().requires_grad_(True)
    loss_mat, _ = _loss(log_prob)
    agg_loss(loss_mat, MASK, "seq-mean-token-mean").backward()
    grad = log_prob.grad
    assert torch.all(grad[:2][MASK[:2] == 1] < 0)  # A > 0: loss falls as logp rises
    assert torch.all(grad[2][MASK[2] == 1] > 0)  # A < 0
    assert torch.all(grad[MASK == 0] == 0)


def test_paper_clip_range_clips_small_drifts():
    # clip 3e-4 / 4e-4: row 0's s = e^0.1 is far outside -> clipped too: all 7 tokens
    paper = actor_config(clip_ratio=0.2, clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    loss_mat, metrics = _loss(OLD + LOG_RATIO, cfg=paper)
    assert float(metrics["pg_clipfrac"]) == pytest.approx(1.0)
    assert loss_mat[0, 0].item() == pytest.approx(-(1 + 4e-4))
    assert loss_mat[2, 0].item() == pytest.approx(1 - 3e-4)
