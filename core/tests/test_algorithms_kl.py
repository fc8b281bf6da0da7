"""KL estimators, KL controllers and the KL-in-reward shaping, against hand-computed values."""

import math

import pytest
import torch

from polyrl.algorithms import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
    make_kl_controller,
)
from polyrl.errors import ConfigError
from polyrl.testing.configs import algorithm_config

torch.set_num_threads(1)

# d = logp - ref = [1, 0, -2]
LOGP = torch.tensor([[0.0, -1.0, -2.0]])
REF = torch.tensor([[-1.0, -1.0, 0.0]])


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (("kl", "k1"), [1.0, 0.0, -2.0]),
        (("abs",), [1.0, 0.0, 2.0]),
        (("mse", "k2"), [0.5, 0.0, 2.0]),  # d^2 / 2
        # x = ref - logp = [-1, 0, 2]; e^x - x - 1 = [e^-1, 0, e^2 - 3]
        (("low_var_kl", "k3"), [math.exp(-1), 0.0, math.exp(2) - 3]),
    ],
)
def test_estimators(kinds, expected):
    for kind in kinds:
        out = kl_penalty(LOGP, REF, kind)
        torch.testing.assert_close(out, torch.tensor([expected]), rtol=1e-6, atol=1e-7)


def test_low_var_kl_is_clamped_to_ten():
    # ref far more likely than the policy: x = 20, e^20 - 21 ~ 4.85e8 -> clamped to 10
    out = kl_penalty(torch.tensor([[-25.0]]), torch.tensor([[-5.0]]), "low_var_kl")
    assert out.item() == 10.0


def test_straight_through_keeps_value_takes_k2_gradient():
    logp = LOGP.clone().requires_grad_(True)
    out = kl_penalty(logp, REF, "k3+")
    torch.testing.assert_close(out.detach(), kl_penalty(LOGP, REF, "k3"))
    out.sum().backward()
    # d/dlogp of d^2/2 is d = [1, 0, -2]
    torch.testing.assert_close(logp.grad, torch.tensor([[1.0, 0.0, -2.0]]))


def test_k3_gradient_without_straight_through():
    logp = LOGP.clone().requires_grad_(True)
    kl_penalty(logp, REF, "low_var_kl").sum().backward()
    # d/dlogp (e^(ref-logp) - (ref-logp) - 1) = 1 - e^(ref-logp) = [1 - e^-1, 0, 1 - e^2]
    expected = torch.tensor([[1 - math.exp(-1), 0.0, 1 - math.exp(2)]])
    torch.testing.assert_close(logp.grad, expected)


def test_unknown_kind():
    for kind in ("k4", "k3++", "+"):
        with pytest.raises(ConfigError, match="low_var_kl"):
            kl_penalty(LOGP, REF, kind)


def test_every_listed_type_is_accepted():
    # the tuple the config validator checks against must name exactly what kl_penalty runs
    assert {"k3", "k3+", "low_var_kl+", "kl", "abs+"} <= set(KL_PENALTY_TYPES)
    for kind in KL_PENALTY_TYPES:
        value = kl_penalty(LOGP, REF, kind)
        plain = kl_penalty(LOGP, REF, kind.removesuffix("+"))
        torch.testing.assert_close(value, plain)


def test_fixed_controller():
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=10.0, n_steps=100)
    assert ctrl.value == 0.05


def test_adaptive_controller():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    # kl 0.15: error 0.5 clipped to 0.2 -> x(1 + 0.2 * 10/100) = 0.102
    ctrl.update(current_kl=0.15, n_steps=10)
    assert ctrl.value == pytest.approx(0.102)
    # kl 0.09: error -0.1 -> x(1 - 0.1 * 10/100) = 0.102 * 0.99 = 0.10098
    ctrl.update(current_kl=0.09, n_steps=10)
    assert ctrl.value == pytest.approx(0.10098)
    # kl 0: error -1 clipped to -0.2 -> x0.98
    ctrl.update(current_kl=0.0, n_steps=10)
    assert ctrl.value == pytest.approx(0.10098 * 0.98)


def test_make_kl_controller_from_configs():
    fixed = make_kl_controller(algorithm_config().kl_ctrl)
    assert isinstance(fixed, FixedKLController) and fixed.value == pytest.approx(0.001)
    adaptive = make_kl_controller(
        algorithm_config(kl_ctrl={"type": "adaptive", "kl_coef": 0.2}).kl_ctrl
    )
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.2, 0.1, 10000)
    short = algorithm_config(kl_ctrl={"type": "adaptive", "target_kl": 1, "horizon": 5})
    assert make_kl_controller(short.kl_ctrl).horizon == 5
    with pytest.raises(ConfigError, match="fixed, adaptive"):
        make_kl_controller(algorithm_config(kl_ctrl={"type": "pid"}).kl_ctrl)
    with pytest.raises(ConfigError, match="horizon > 0"):
        make_kl_controller(algorithm_config(kl_ctrl={"type": "adaptive", "horizon": 0}).kl_ctrl)


def test_apply_kl_in_reward():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    ref = torch.zeros(2, 3)
    # k1 = logp - ref; the 9.0 is padding
    logp = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    ctrl = AdaptiveKLController(init_kl_coef=0.5, target_kl=0.1, horizon=10)
    rewards, metrics = apply_kl_in_reward(scores, logp, ref, mask, ctrl, "kl")
    # rewards = scores - 0.5 * kl, zero on padding
    expected = torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 1.75, 0.0]])
    torch.testing.assert_close(rewards, expected)
    # sequence means 0.2 and 0.45 -> batch mean 0.325; coeff reported is the one used (0.5)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.325)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.5)
    # controller: error clip(0.325/0.1 - 1) = 0.2, n_steps = 2 rows -> 0.5 * (1 + 0.2*2/10)
    assert ctrl.value == pytest.approx(0.52)
