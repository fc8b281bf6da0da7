"""The actor's micro-batch loss: composition, mini-batch normalisation and gradient direction."""

import pytest
import torch

from polyrl.algorithms import (
    LOSS_AGG_MODES,
    loss_norm_totals,
    make_actor_loss_fn,
    vanilla_policy_loss,
)
from polyrl.batch import Batch
from polyrl.testing.configs import actor_config

torch.set_num_threads(1)


def test_loss_is_pg_minus_entropy_plus_kl():
    # On-policy (r = 1) the per-token PPO loss is -A.
    adv = torch.tensor([[1.0, 1.0, 7.0], [-0.5, -0.5, -0.5]])  # the 7.0 is padding
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    logp = torch.full((2, 3), -2.0)
    batch = Batch(
        {
            "old_log_probs": logp.clone(),
            "advantages": adv,
            "response_mask": mask,
            "ref_log_prob": logp - 0.1,  # k1 = 0.1 on every token
        }
    )
    entropy = torch.tensor([[2.0, 2.0, 50.0], [1.0, 1.0, 1.0]])
    cfg = actor_config(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="kl")
    loss, metrics = make_actor_loss_fn(cfg, vanilla_policy_loss)(batch, logp, entropy)
    # pg (token-mean) = (-1 - 1 + 0.5 * 3) / 5 = -0.1
    # entropy = (2 + 2 + 1 + 1 + 1) / 5 = 1.4 -> -0.01 * 1.4 = -0.014
    # kl = 0.1 -> +0.5 * 0.1 = 0.05 ; total -0.064
    assert loss.item() == pytest.approx(-0.064, abs=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(-0.1)
    assert metrics["actor/entropy"] == pytest.approx(1.4)
    assert metrics["actor/kl_loss"] == pytest.approx(0.1)
    assert metrics["actor/kl_coef"] == 0.5
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/ppo_kl"] == 0.0
    assert all(isinstance(v, float) for v in metrics.values())


def test_no_entropy_or_kl_metrics_unless_used():
    batch = Batch(
        {
            "old_log_probs": torch.zeros(1, 2),
            "advantages": torch.ones(1, 2),
            "response_mask": torch.ones(1, 2),
        }
    )
    loss, metrics = make_actor_loss_fn(actor_config(), vanilla_policy_loss)(
        batch, torch.zeros(1, 2), None
    )
    assert loss.item() == pytest.approx(-1.0)
    assert "actor/entropy" not in metrics and "actor/kl_loss" not in metrics
    # truncated IS is off by default, so the batch needs no rollout_log_probs either
    assert not any("tis" in name for name in metrics)


def test_a_policy_losss_metric_with_its_own_group_keeps_its_name():
    """verl logs its rollout correction as rollout_corr/*, not under actor/."""

    def loss_with_groups(batch, log_prob, config):
        return log_prob * 0, {"ppo_kl": 0.5, "rollout_corr/kl": 0.25}

    batch = Batch({"advantages": torch.ones(1, 2), "response_mask": torch.ones(1, 2)})
    _, metrics = make_actor_loss_fn(actor_config(), loss_with_groups)(
        batch, torch.zeros(1, 2), None
    )
    assert metrics["actor/ppo_kl"] == 0.5 and metrics["rollout_corr/kl"] == 0.25
    assert "actor/rollout_corr/kl" not in metrics


def test_rollout_is_weights_in_the_batch_weigh_a_token_level_policy_loss():
    """verl's decoupled rollout correction: a stage puts them in the batch, every loss obeys."""
    weights = torch.tensor([[0.5, 2.0]])
    batch = Batch(
        {
            "old_log_probs": torch.zeros(1, 2),
            "advantages": torch.ones(1, 2),
            "response_mask": torch.ones(1, 2),
            "rollout_is_weights": weights,
        }
    )
    loss, _ = make_actor_loss_fn(actor_config(), vanilla_policy_loss)(
        batch, torch.zeros(1, 2), None
    )
    assert loss.item() == pytest.approx(-(0.5 + 2.0) / 2)  # on-policy PPO loss is -A per token
    sequence_loss = make_actor_loss_fn(
        actor_config(), lambda b, lp, c: (lp.sum(-1), {}), "sequence"
    )
    with pytest.raises(ValueError, match="rollout_is_weights and the policy loss is sequence"):
        sequence_loss(batch, torch.zeros(1, 2), None)


def test_kl_loss_needs_reference_log_probs():
    batch = Batch(
        {
            "old_log_probs": torch.zeros(1, 2),
            "advantages": torch.ones(1, 2),
            "response_mask": torch.ones(1, 2),
        }
    )
    fn = make_actor_loss_fn(actor_config(use_kl_loss=True), vanilla_policy_loss)
    with pytest.raises(KeyError, match="ref_log_prob"):
        fn(batch, torch.zeros(1, 2), None)


def _random_mini_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows, width = 4, 6
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    )
    old = -torch.rand(rows, width, generator=gen) - 0.5
    logp = old + 0.3 * torch.randn(rows, width, generator=gen)  # some tokens get clipped
    batch = Batch(
        {
            "old_log_probs": old,
            "advantages": torch.randn(rows, 1, generator=gen).expand(rows, width) * mask,
            "response_mask": mask,
            "ref_log_prob": old - 0.2 * torch.rand(rows, width, generator=gen),
        }
    )
    entropy = torch.rand(rows, width, generator=gen)
    return batch, logp, entropy


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_losses_and_gradients_sum_to_the_mini_batch(mode):
    batch, logp, entropy = _random_mini_batch()
    cfg = actor_config(loss_agg_mode=mode, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    fn = make_actor_loss_fn(cfg, vanilla_policy_loss)

    whole_lp = logp.clone().requires_grad_(True)
    whole, _ = fn(batch, whole_lp, entropy)
    whole.backward()

    batch.meta["loss_norm"] = loss_norm_totals(batch["response_mask"])  # set by the trainer
    micro_lp = logp.clone().requires_grad_(True)
    total = torch.zeros(())
    micro_pg = []
    for start in (0, 2):
        micro = batch.slice(start, start + 2)  # inherits meta
        loss, metrics = fn(micro, micro_lp[start : start + 2], entropy[start : start + 2])
        loss.backward()
        total = total + loss.detach()
        micro_pg.append(metrics["actor/pg_loss"])
    assert total.item() == pytest.approx(whole.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(micro_lp.grad, whole_lp.grad)
    # metrics are each micro-batch's own plain aggregate, not its share of the mini-batch
    alone = Batch(dict(batch.slice(0, 2).tensors))  # no meta: aggregated by itself
    own = fn(alone, logp[:2], entropy[:2])[1]
    assert micro_pg[0] == pytest.approx(own["actor/pg_loss"])


def test_without_loss_norm_a_micro_batch_is_aggregated_alone():
    batch, logp, _ = _random_mini_batch()
    fn = make_actor_loss_fn(actor_config(), vanilla_policy_loss)
    loss, metrics = fn(batch.slice(0, 2), logp[:2], None)
    assert loss.item() == pytest.approx(metrics["actor/pg_loss"])


def test_loss_agg_mode_comes_from_the_config_and_is_validated():
    batch = Batch(
        {
            "old_log_probs": torch.zeros(2, 4),
            "advantages": torch.ones(2, 4),
            "response_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
        }
    )
    cfg = actor_config(loss_agg_mode="seq-mean-token-sum-norm")
    loss, _ = make_actor_loss_fn(cfg, vanilla_policy_loss)(batch, torch.zeros(2, 4), None)
    # -(4 + 2) tokens / (2 seqs * width 4) = -0.75 (token-mean would give -1)
    assert loss.item() == pytest.approx(-0.75)
    with pytest.raises(ValueError, match="token-mean"):
        make_actor_loss_fn(actor_config(loss_agg_mode="mean"), vanilla_policy_loss)


def test_the_policy_loss_gets_the_micro_batch_and_the_actor_config():
    # A loss may read any key its spec requires (here rollout_log_probs) and any actor knob.
    seen = {}

    def probe_loss(batch, log_prob, config):
        seen.update(batch=batch, log_prob=log_prob, clip_ratio=config.clip_ratio)
        return (log_prob - batch["rollout_log_probs"]) * batch["response_mask"], {"probe": 1.0}

    batch = Batch(
        {
            "rollout_log_probs": torch.full((1, 2), -1.0),
            "response_mask": torch.ones(1, 2),
        }
    )
    logp = torch.zeros(1, 2)
    loss, metrics = make_actor_loss_fn(actor_config(clip_ratio=0.3), probe_loss)(batch, logp, None)
    assert seen["batch"] is batch and seen["log_prob"] is logp and seen["clip_ratio"] == 0.3
    assert loss.item() == pytest.approx(1.0)  # token-mean of logp - rollout = 1
    assert metrics["actor/probe"] == 1.0


def test_gradient_descent_moves_log_probs_with_the_advantage_sign():
    # A tiny policy: free logits over a 5-token vocabulary at 3 positions for 2 responses.
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, requires_grad=True)
    responses = torch.tensor([[1, 3, 0], [2, 2, 4]])

    def log_prob():
        return torch.log_softmax(logits, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)

    start = log_prob().detach()
    batch = Batch(
        {
            "old_log_probs": start.clone(),
            "advantages": torch.tensor([[1.0] * 3, [-1.0] * 3]),
            "response_mask": torch.ones(2, 3),
        }
    )
    fn = make_actor_loss_fn(actor_config(), vanilla_policy_loss)
    opt = torch.optim.SGD([logits], lr=0.1)
    loss, _ = fn(batch, log_prob(), None)
    loss.backward()
    opt.step()
    after = log_prob().detach()
    assert torch.all(after[0] > start[0]), "positive advantage must raise log-probs"
    assert torch.all(after[1] < start[1]), "negative advantage must lower log-probs"


def test_the_loss_tells_the_engine_whether_the_entropy_needs_its_gradient():
    from polyrl.interfaces.training_engine import needs_entropy_grad
    from polyrl.workers.roles.actor import on_policy

    with_bonus = make_actor_loss_fn(actor_config(entropy_coeff=0.01), vanilla_policy_loss)
    without = make_actor_loss_fn(actor_config(entropy_coeff=0.0), vanilla_policy_loss)
    assert needs_entropy_grad(with_bonus) and not needs_entropy_grad(without)
    # the on-policy wrapper of a single-step update keeps what the loss needs
    assert needs_entropy_grad(on_policy(with_bonus)) and not needs_entropy_grad(on_policy(without))
    # and its old log-probs are the detached current ones: the ratio is 1, the loss is -A
    logp = torch.full((1, 2), -1.0, requires_grad=True)
    batch = Batch({"advantages": torch.ones(1, 2), "response_mask": torch.ones(1, 2)})
    loss, _ = on_policy(without)(batch, logp, None)
    assert torch.equal(batch["old_log_probs"], logp.detach())
    assert loss.item() == pytest.approx(-1.0)
