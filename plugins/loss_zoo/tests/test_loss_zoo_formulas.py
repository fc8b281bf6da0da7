"""Each loss against verl's formula, re-implemented here token by token in plain Python on the
hand-made batch of zoo_inputs (ratios 1.3, 0.5, 1.056 | 1.5, 0.833 | 6.0; advantages +1.5, -0.8,
+0.7), and against values worked out by hand where they are short."""

from __future__ import annotations

import math

import pytest
import torch
from zoo_inputs import ADV, LENGTHS, NEW_P, OLD_P, actor_node, batch_and_log_prob, tokens

from polyrl.api import ConfigError
from polyrl_loss_zoo.clipped_weight import cispo_policy_loss
from polyrl_loss_zoo.covariance import clip_cov_loss, clip_cov_policy_loss, kl_cov_policy_loss
from polyrl_loss_zoo.dppo import dppo_kl_policy_loss, dppo_tv_policy_loss
from polyrl_loss_zoo.geo_mean import geo_mean_policy_loss
from polyrl_loss_zoo.plain_gradient import dro_policy_loss, gpg_policy_loss
from polyrl_loss_zoo.sapo import sapo_policy_loss


def log_ratio(i: int, t: int) -> float:
    return math.log(NEW_P[i][t]) - math.log(OLD_P[i][t])


def token_matrix(value) -> torch.Tensor:
    """``value(i, t)`` on the response tokens, 0 on padding."""
    out = torch.zeros(3, 3)
    for i, t in tokens():
        out[i, t] = value(i, t)
    return out


def token_mean(value) -> float:
    return sum(value(i, t) for i, t in tokens()) / len(tokens())


def close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got.detach(), expected, rtol=1e-5, atol=1e-6)


def test_gpg_is_minus_advantage_times_log_prob():
    batch, log_prob = batch_and_log_prob()
    loss, metrics = gpg_policy_loss(batch, log_prob, actor_node())
    close(loss, token_matrix(lambda i, t: -ADV[i] * math.log(NEW_P[i][t])))
    assert metrics == {}


def test_dro_adds_the_quadratic_log_ratio_penalty():
    batch, log_prob = batch_and_log_prob()
    cfg = actor_node(policy_loss={"dro_beta": 0.5})
    loss, metrics = dro_policy_loss(batch, log_prob, cfg)
    expected = token_matrix(
        lambda i, t: -(ADV[i] * math.log(NEW_P[i][t]) - 0.25 * log_ratio(i, t) ** 2)
    )
    close(loss, expected)
    assert float(metrics["ppo_kl"]) == pytest.approx(token_mean(lambda i, t: -log_ratio(i, t)))
    # d/dlogp: -A + beta * log r; row 2's token: -0.7 + 0.5 * ln 6
    loss.sum().backward()
    assert float(log_prob.grad[2, 0]) == pytest.approx(-0.7 + 0.5 * math.log(6.0), rel=1e-5)


@pytest.mark.parametrize("beta", [None, 0.0, -1.0])
def test_dro_refuses_a_missing_or_non_positive_beta(beta):
    batch, log_prob = batch_and_log_prob()
    with pytest.raises(ConfigError, match=r"policy_loss\.dro_beta"):
        dro_policy_loss(batch, log_prob, actor_node(policy_loss={"dro_beta": beta}))


def test_cispo_clips_the_detached_weight_and_keeps_every_gradient():
    batch, log_prob = batch_and_log_prob()
    loss, metrics = cispo_policy_loss(batch, log_prob, actor_node())  # clip 0.2: [0.8, 1.2]

    def weight(i, t):
        return min(max(math.exp(log_ratio(i, t)), 0.8), 1.2)

    close(loss, token_matrix(lambda i, t: -weight(i, t) * ADV[i] * math.log(NEW_P[i][t])))
    # 1.3, 0.5, 1.5 and 6.0 are outside [0.8, 1.2]: 4 of 6 tokens
    assert float(metrics["pg_clipfrac"]) == pytest.approx(4 / 6)
    loss.sum().backward()
    close(log_prob.grad, token_matrix(lambda i, t: -weight(i, t) * ADV[i]))
    assert (log_prob.grad[batch["response_mask"] > 0] != 0).all()


def _dppo_reference(inside, cap):
    def weight(i, t):
        return min(math.exp(log_ratio(i, t)), cap) * inside(i, t)

    loss = token_matrix(lambda i, t: -ADV[i] * weight(i, t) * math.log(NEW_P[i][t]))
    masked = token_mean(lambda i, t: 1.0 - inside(i, t))
    lower = token_mean(lambda i, t: float(math.exp(log_ratio(i, t)) > cap) * inside(i, t))
    return loss, masked, lower


def test_dppo_tv_masks_tokens_whose_probability_moved_too_far():
    # changes p - p_old: +0.15 -0.1 +0.05 | +0.15 -0.1 | +0.25 (A > 0: out past +0.2)
    def inside(i, t):
        change = NEW_P[i][t] - OLD_P[i][t]
        return float(change <= 0.2 if ADV[i] > 0 else change >= -0.2)

    batch, log_prob = batch_and_log_prob()
    cfg = actor_node(clip_ratio_c=1.25)  # ratios 1.3 and 1.5 are kept but truncated
    loss, metrics = dppo_tv_policy_loss(batch, log_prob, cfg)
    expected, masked, lower = _dppo_reference(inside, 1.25)
    close(loss, expected)
    assert float(metrics["pg_clipfrac"]) == pytest.approx(masked) == pytest.approx(1 / 6)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(lower) == pytest.approx(2 / 6)
    assert float(loss.detach()[2, 0]) == 0.0


def test_dppo_kl_uses_the_binary_kl_of_the_token_probability():
    def binary_kl(i, t):
        p, q = NEW_P[i][t], OLD_P[i][t]
        return q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))

    def inside(i, t):
        p, q, kl = NEW_P[i][t], OLD_P[i][t], binary_kl(i, t)
        return float((kl <= 0.05 or p <= q) if ADV[i] > 0 else (kl <= 0.05 or p >= q))

    batch, log_prob = batch_and_log_prob()
    loss, metrics = dppo_kl_policy_loss(batch, log_prob, actor_node(clip_ratio=0.05))
    expected, masked, lower = _dppo_reference(inside, 3.0)  # verl's clip_ratio_c default
    close(loss, expected)
    assert float(metrics["pg_clipfrac"]) == pytest.approx(masked)
    assert 0 < masked < 1  # the threshold splits this batch
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(lower)


def test_sapo_gate_averaged_per_response():
    def gate(i, t):
        tau = 1.0 if ADV[i] > 0 else 1.05
        r = math.exp(log_ratio(i, t))
        return 4.0 / tau / (1.0 + math.exp(-tau * (r - 1.0)))

    batch, log_prob = batch_and_log_prob()
    loss, metrics = sapo_policy_loss(batch, log_prob, actor_node())
    expected = [sum(-gate(i, t) * ADV[i] for t in range(LENGTHS[i])) / LENGTHS[i] for i in range(3)]
    close(loss, torch.tensor(expected))
    assert metrics["pg_clipfrac"] == 0.0 and metrics["pg_clipfrac_lower"] == 0.0


def test_sapo_is_the_policy_gradient_on_policy_and_reads_its_temperatures():
    batch, _ = batch_and_log_prob()
    on_policy = batch["old_log_probs"].clone().requires_grad_(True)
    loss, _ = sapo_policy_loss(batch, on_policy, actor_node(tau_pos=3.0, tau_neg=5.0))
    # at r = 1 the gate is 2 / tau and its slope is 1 for any tau, so d(row mean)/dlogp_t is
    # -A_i / |y_i|
    close(loss, torch.tensor([-(2 / 3) * 1.5, -(2 / 5) * -0.8, -(2 / 3) * 0.7]))
    loss.sum().backward()
    close(on_policy.grad, token_matrix(lambda i, t: -ADV[i] / LENGTHS[i]))


def test_geo_mean_clips_log_ratios_and_takes_the_geometric_mean():
    def pessimistic(i, t):
        x = log_ratio(i, t)
        s = math.copysign(1.0, ADV[i])
        return s * min(s * x, s * min(max(x, -0.4), 0.4))

    batch, log_prob = batch_and_log_prob()
    loss, metrics = geo_mean_policy_loss(batch, log_prob, actor_node(clip_ratio=0.4))
    expected = [
        -ADV[i] * math.exp(sum(pessimistic(i, t) for t in range(n)) / n)
        for i, n in enumerate(LENGTHS)
    ]
    close(loss, torch.tensor(expected))
    # |log r| > 0.4: ln 0.5 (A > 0), ln 1.5 (A < 0), ln 6 (A > 0)
    assert float(metrics["pg_clipfrac"]) == pytest.approx(2 / 6)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(1 / 6)
    # row 2 is clipped on the rewarded side: no gradient; row 0's ln 0.5 keeps its own
    loss.sum().backward()
    assert float(log_prob.grad[2, 0]) == 0.0 and float(log_prob.grad[0, 1]) != 0.0


def _ppo_surrogate(i, t, low=0.2, high=0.2):
    r = math.exp(log_ratio(i, t))
    return max(-ADV[i] * r, -ADV[i] * min(max(r, 1 - low), 1 + high))


def _cov(i, t):
    logp = {(i, t): math.log(NEW_P[i][t]) for i, t in tokens()}
    mean_a = token_mean(lambda i, t: ADV[i])
    mean_l = sum(logp.values()) / len(logp)
    return (ADV[i] - mean_a) * (logp[(i, t)] - mean_l)


def test_clip_cov_detaches_the_chosen_tokens():
    # PPO clips (0, 0) (r = 1.3, A > 0) and (2, 0) (r = 6): the other four are candidates,
    # every covariance lies in (-10, 10); int(0.5 * 6 tokens) = 3 are chosen.
    cfg = actor_node(policy_loss={"clip_cov_ratio": 0.5, "clip_cov_lb": -10, "clip_cov_ub": 10})
    batch, log_prob = batch_and_log_prob()
    asked = []

    def choose(candidates, count):
        asked.append((candidates, count))
        return torch.tensor([3, 0, 1])[:count]  # candidates in row-major order: pick 3, 0, 1

    loss, metrics = clip_cov_loss(batch, log_prob, cfg, choose)
    assert asked == [(4, 3)]
    detached = {(1, 1), (0, 1), (0, 2)}
    close(loss, token_matrix(lambda i, t: 0.0 if (i, t) in detached else _ppo_surrogate(i, t)))
    assert float(metrics["pg_clipfrac"]) == pytest.approx(3 / 6)
    loss.sum().backward()
    assert all(float(log_prob.grad[i, t]) == 0.0 for i, t in detached)
    assert float(log_prob.grad[1, 0]) != 0.0


def test_clip_cov_candidates_lie_between_the_bounds():
    # with verl's bounds (1, 5) only tokens of a strong covariance are candidates
    batch, log_prob = batch_and_log_prob()
    cfg = actor_node(policy_loss={"clip_cov_ratio": 0.9})
    seen = []
    clip_cov_loss(batch, log_prob, cfg, lambda n, k: seen.append((n, k)) or torch.arange(k))
    unclipped = [(0, 1), (0, 2), (1, 0), (1, 1)]
    expected = sum(1 < _cov(i, t) < 5 for i, t in unclipped)
    assert seen == [(expected, min(5, expected))]


def test_clip_cov_random_choice_follows_the_global_seed():
    cfg = actor_node(policy_loss={"clip_cov_ratio": 0.34, "clip_cov_lb": -10, "clip_cov_ub": 10})
    batch, log_prob = batch_and_log_prob()
    torch.manual_seed(7)
    loss, _ = clip_cov_policy_loss(batch, log_prob, cfg)
    torch.manual_seed(7)
    chosen = torch.randperm(4)[:2].tolist()  # verl's draw: a permutation of the candidates
    candidates = [(0, 1), (0, 2), (1, 0), (1, 1)]
    detached = {candidates[k] for k in chosen}
    close(loss, token_matrix(lambda i, t: 0.0 if (i, t) in detached else _ppo_surrogate(i, t)))


def test_kl_cov_penalises_the_top_covariance_tokens():
    cfg = actor_node(policy_loss={"kl_cov_ratio": 0.34, "ppo_kl_coef": 0.1})
    batch, log_prob = batch_and_log_prob()
    loss, metrics = kl_cov_policy_loss(batch, log_prob, cfg)
    top = set(sorted(tokens(), key=lambda it: _cov(*it), reverse=True)[:2])  # int(6 * 0.34)

    def expected(i, t):
        plain = -ADV[i] * math.exp(log_ratio(i, t))
        return plain + (0.1 * abs(log_ratio(i, t)) if (i, t) in top else 0.0)

    close(loss, token_matrix(expected))
    assert float(metrics["ppo_kl"]) == pytest.approx(token_mean(lambda i, t: abs(log_ratio(i, t))))


@pytest.mark.parametrize(
    ("loss_fn", "key"),
    [(clip_cov_policy_loss, "clip_cov_ratio"), (kl_cov_policy_loss, "kl_cov_ratio")],
)
def test_covariance_losses_refuse_a_non_positive_share(loss_fn, key):
    batch, log_prob = batch_and_log_prob()
    with pytest.raises(ConfigError, match=key):
        loss_fn(batch, log_prob, actor_node(policy_loss={key: 0.0}))
