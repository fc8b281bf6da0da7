"""The PPO clipped / dual-clipped policy loss against values worked out by hand."""

import math

import pytest
import torch

from polyrl.algorithms import agg_loss, vanilla_policy_loss
from polyrl.batch import Batch
from polyrl.errors import ConfigError
from polyrl.testing.configs import actor_config

torch.set_num_threads(1)

CFG = actor_config()  # clip_ratio 0.2 (low and high fall back to it), clip_ratio_c 3

# Five real tokens and one padding token, ratio r = pi/pi_old, advantage A (clip 0.2, c = 3):
#   t1 A=+1 r=1.5 : max(-1.5, -1.2) = -1.2   clipped (upper)
#   t2 A=+1 r=0.5 : max(-0.5, -0.8) = -0.5   not clipped
#   t3 A=-1 r=0.5 : max( 0.5,  0.8) =  0.8   clipped (lower); dual bound 3 not reached
#   t4 A=-1 r=5.0 : max( 5.0,  1.2) =  5.0 -> min(5.0, 3) = 3   dual clip
#   t5 A=-1 r=1.1 : max( 1.1,  1.1) =  1.1   not clipped
#   pad A=+1 r=e^10: ignored
RATIOS = torch.tensor([[1.5, 0.5, 0.5], [5.0, 1.1, math.exp(10)]])
ADV = torch.tensor([[1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
OLD = torch.full((2, 3), -1.0)


def _call(old, log_prob, adv, mask, cfg=CFG):
    batch = Batch({"old_log_probs": old, "advantages": adv, "response_mask": mask})
    return vanilla_policy_loss(batch, log_prob, cfg)


def _loss(ratios=RATIOS, adv=ADV, mask=MASK, cfg=CFG, log_prob=None):
    log_prob = OLD + torch.log(ratios) if log_prob is None else log_prob
    return _call(OLD, log_prob, adv, mask, cfg)


def test_loss_matrix_values():
    loss_mat, _ = _loss()
    expected = torch.tensor([[-1.2, -0.5, 0.8], [3.0, 1.1, 0.0]])
    torch.testing.assert_close(loss_mat, expected, rtol=1e-5, atol=1e-6)


def test_metrics():
    _, metrics = _loss()
    # clipped branch taken on t1, t3 -> 2/5 ; dual clip on t4 -> 1/5
    assert float(metrics["pg_clipfrac"]) == pytest.approx(0.4)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(0.2)
    # ppo_kl = mean(-log r) = -(ln1.5 + 2 ln0.5 + ln5 + ln1.1) / 5 = -0.7239188 / 5
    expected_kl = -(math.log(1.5) + 2 * math.log(0.5) + math.log(5) + math.log(1.1)) / 5
    assert float(metrics["ppo_kl"]) == pytest.approx(expected_kl, rel=1e-5)
    assert expected_kl == pytest.approx(-0.1447838, rel=1e-5)


def test_asymmetric_clip_higher():
    # DAPO clip-higher: low 0.2, high 0.28. A=+1, r=1.25 is inside [0.8, 1.28]: loss -1.25;
    # with symmetric 0.2 it would be clipped to -1.2. r=1.5 clips to -1.28.
    cfg = actor_config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3)
    ratios = torch.tensor([[1.25, 1.5, 0.7]])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    old = torch.zeros(1, 3)
    loss_mat, m = _call(old, torch.log(ratios), adv, mask, cfg)
    # t3: A=-1, r=0.7 < 0.8: max(0.7, 0.8) = 0.8 (clipped at the LOW bound)
    torch.testing.assert_close(loss_mat, torch.tensor([[-1.25, -1.28, 0.8]]))
    assert float(m["pg_clipfrac"]) == pytest.approx(2 / 3)
    sym, _ = _call(old, torch.log(ratios), adv, mask, CFG)
    assert sym[0, 0].item() == pytest.approx(-1.2)


def test_unset_low_and_high_clip_ratios_fall_back_to_clip_ratio():
    # clip_ratio 0.1, low/high left None: t1 (A=+1, r=1.5) clips at 1.1, t3 (A=-1, r=0.5) at 0.9
    loss_mat, _ = _loss(cfg=actor_config(clip_ratio=0.1))
    assert loss_mat[0, 0].item() == pytest.approx(-1.1)
    assert loss_mat[0, 2].item() == pytest.approx(0.9)
    # only the high side set (DAPO clip-higher): the low side keeps clip_ratio
    loss_mat, _ = _loss(cfg=actor_config(clip_ratio=0.1, clip_ratio_high=0.3))
    assert loss_mat[0, 0].item() == pytest.approx(-1.3)
    assert loss_mat[0, 2].item() == pytest.approx(0.9)


def test_dual_clip_bound_must_exceed_one():
    cfg = actor_config(clip_ratio_c=1.0)
    with pytest.raises(ConfigError, match="clip_ratio_c must be > 1"):
        _loss(cfg=cfg)


def test_extreme_log_ratio_is_clamped_and_finite():
    # log-ratio 50 is clamped to 20: A=+1 -> clipped to -1.2; A=-1 -> dual clip 3.
    log_prob = (OLD + 50.0).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0]])
    loss_mat, m = _loss(adv=adv, mask=torch.ones(2, 3), log_prob=log_prob)
    torch.testing.assert_close(loss_mat, torch.tensor([[-1.2, 3.0, -1.2], [3.0, -1.2, 3.0]]))
    loss_mat.sum().backward()
    assert torch.isfinite(log_prob.grad).all()
    assert float(m["ppo_kl"]) == pytest.approx(-20.0)


def test_gradient_direction_and_size():
    # At r = 1 (on-policy) d(-A r)/d logp = -A r = -A. With token-mean over 4 tokens: -A/4.
    adv = torch.tensor([[2.0, -1.0], [0.5, -3.0]])
    log_prob = OLD[:, :2].clone().requires_grad_(True)
    loss_mat, _ = _call(OLD[:, :2], log_prob, adv, torch.ones(2, 2))
    agg_loss(loss_mat, torch.ones(2, 2), "token-mean").backward()
    torch.testing.assert_close(log_prob.grad, -adv / 4)
    # gradient descent raises log-probs of positive-advantage tokens, lowers the negative ones
    stepped = log_prob.detach() - 0.1 * log_prob.grad
    assert torch.equal(stepped > OLD[:, :2], adv > 0)


def test_clipped_and_dual_clipped_tokens_have_no_gradient():
    log_prob = (OLD + torch.log(RATIOS)).requires_grad_(True)
    loss_mat, _ = _loss(log_prob=log_prob)
    loss_mat.sum().backward()
    grad = log_prob.grad
    # t1 (clipped), t3 (clipped), t4 (dual clip), padding: zero; t2: -A r = -0.5; t5: -A r = 1.1
    torch.testing.assert_close(
        grad, torch.tensor([[0.0, -0.5, 0.0], [0.0, 1.1, 0.0]]), rtol=1e-5, atol=1e-6
    )
