"""DPO and IPO against values derived by hand from the formulas of TRL's DPOTrainer
(loss_type="sigmoid" and "ipo"): sequence-level losses the actor averages over pairs."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.algorithms.actor_loss import make_actor_loss_fn
from polyrl.batch import Batch
from polyrl.testing.configs import actor_config
from polyrl_algo_dpo.loss import dpo_loss, ipo_loss, pair_terms


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def two_pairs() -> tuple[Batch, torch.Tensor]:
    """Pair 0: chosen tokens log-probs [-1, -2] (reference [-1.5, -2]), rejected [-1]
    (reference [-0.5]). Pair 1: chosen [-2] (reference [-1]), rejected [-1] (reference [-1]).
    Rows: chosen 0, rejected 0, chosen 1, rejected 1; width 2, padding zero."""
    log_prob = torch.tensor([[-1.0, -2.0], [-1.0, 0.0], [-2.0, 0.0], [-1.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0], [-0.5, 0.0], [-1.0, 0.0], [-1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    return Batch({"ref_log_prob": ref, "response_mask": mask}), log_prob.requires_grad_(True)


# Sequence log-ratios: pair 0: chosen -3 - -3.5 = 0.5, rejected -1 - -0.5 = -0.5, margin h = 1;
# pair 1: chosen -2 - -1 = -1, rejected 0, h = -1. With beta = 0.1:
PAIR0_DPO = math.log(1 + math.exp(-0.1))  # -log sigmoid(0.1) = 0.64439...
PAIR1_DPO = math.log(1 + math.exp(0.1))  # -log sigmoid(-0.1) = 0.74439...


def test_dpo_loss_values_and_trl_metrics() -> None:
    batch, log_prob = two_pairs()
    loss, metrics = dpo_loss(batch, log_prob, actor_config())
    # One value per row: both rows of a pair carry the pair's loss.
    expected = torch.tensor([PAIR0_DPO, PAIR0_DPO, PAIR1_DPO, PAIR1_DPO])
    assert torch.allclose(loss, expected, atol=1e-6)
    assert metrics == pytest.approx(
        {
            "rewards/chosen": (0.1 * 0.5 + 0.1 * -1.0) / 2,
            "rewards/rejected": (0.1 * -0.5 + 0.0) / 2,
            "rewards/accuracies": 0.5,  # pair 0 prefers the chosen response, pair 1 does not
            "rewards/margins": (0.1 * 1.0 + 0.1 * -1.0) / 2,
            "logps/chosen": (-3.0 + -2.0) / 2,
            "logps/rejected": (-1.0 + -1.0) / 2,
        }
    )


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_dpo_is_the_mean_over_pairs_with_its_gradient(agg: str) -> None:
    batch, log_prob = two_pairs()
    # a sequence-level loss: the aggregation of token-level terms does not weigh it
    loss_fn = make_actor_loss_fn(actor_config(loss_agg_mode=agg), dpo_loss, "sequence")
    loss, metrics = loss_fn(batch, log_prob, None)
    assert float(loss.detach()) == pytest.approx((PAIR0_DPO + PAIR1_DPO) / 2, abs=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx((PAIR0_DPO + PAIR1_DPO) / 2, abs=1e-6)
    loss.backward()
    # dL_i/dh_i = -beta sigmoid(-beta h_i); h rises with the chosen log-probs, falls with the
    # rejected ones; the mean over 2 pairs halves it.
    g0, g1 = -0.1 * sigmoid(-0.1) / 2, -0.1 * sigmoid(0.1) / 2
    expected = torch.tensor([[g0, g0], [-g0, 0.0], [g1, 0.0], [-g1, 0.0]])
    assert torch.allclose(log_prob.grad, expected, atol=1e-7)


def test_micro_batches_of_whole_pairs_sum_to_the_mean_over_pairs() -> None:
    batch, log_prob = two_pairs()
    loss_fn = make_actor_loss_fn(actor_config(), dpo_loss, "sequence")
    total = 0.0
    for rows in ([0, 1], [2, 3]):
        micro = batch.select_rows(rows)
        # the mini-batch's denominators, as the actor sets them (4 rows)
        micro.meta["loss_norm"] = {"num_seqs": 4, "num_tokens": 5, "max_len": 2}
        loss, _ = loss_fn(micro, log_prob.detach()[rows], None)
        total += float(loss)
    assert total == pytest.approx((PAIR0_DPO + PAIR1_DPO) / 2, abs=1e-6)


def test_ipo_uses_token_mean_log_probs() -> None:
    batch, log_prob = two_pairs()
    loss, metrics = ipo_loss(batch.select_rows([0, 1]), log_prob[:2], actor_config())
    # Token means: chosen -1.5 vs reference -1.75 -> 0.25; rejected -1 vs -0.5 -> -0.5;
    # h = 0.75, target 1 / (2 * 0.1) = 5: L = (0.75 - 5)^2 = 18.0625.
    assert torch.allclose(loss, torch.tensor([18.0625, 18.0625]))
    assert metrics["rewards/chosen"] == pytest.approx(0.025)
    assert metrics["rewards/rejected"] == pytest.approx(-0.05)
    assert metrics["rewards/margins"] == pytest.approx(0.075)
    assert metrics["logps/chosen"] == pytest.approx(-1.5)
    loss.sum().backward()
    # d/dh = 2 (h - 5) = -8.5; the chosen row's 2 tokens each move h by 1/2, the rejected token
    # by -1; the sum over the pair's 2 rows counts L twice.
    grad = log_prob.grad[:2]
    assert torch.allclose(grad, 2 * torch.tensor([[-4.25, -4.25], [8.5, 0.0]]))


def test_beta_is_read_from_the_plugin_section() -> None:
    batch, log_prob = two_pairs()
    # The loss gets the actor node of the run config; beta lives at the config's root.
    cfg = OmegaConf.create({"actor_rollout_ref": {"actor": {}}, "plugins": {"dpo": {"beta": 0.5}}})
    loss, metrics = dpo_loss(batch, log_prob, cfg.actor_rollout_ref.actor)
    assert float(loss[0].detach()) == pytest.approx(math.log(1 + math.exp(-0.5)))
    assert metrics["rewards/chosen"] == pytest.approx((0.5 * 0.5 + 0.5 * -1.0) / 2)


def test_an_odd_number_of_rows_is_a_split_pair() -> None:
    batch, log_prob = two_pairs()
    with pytest.raises(ValueError, match="rows come in pairs"):
        pair_terms(
            log_prob[:3], batch["ref_log_prob"][:3], batch["response_mask"][:3], 0.1, "sigmoid"
        )
