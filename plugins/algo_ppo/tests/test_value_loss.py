"""The clipped value loss against hand-worked numbers, and the critic's micro-batch loss function
(verl's ``compute_value_loss``: ``0.5 * agg(max((v - R)^2, (clip(v, v_old +- c) - R)^2))``)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl_algo_ppo.value_loss import clipped_value_loss, make_value_loss_fn


def loss_fn_for(mode: str = "token-mean", cliprange: float = 0.5):
    return make_value_loss_fn(
        OmegaConf.create({"loss_agg_mode": mode, "cliprange_value": cliprange})
    )


def test_hand_worked_values():
    # clip range 0.5:
    #   v=2,   old 0, R=1:  clip 0.5 -> max((2-1)^2, (0.5-1)^2) = max(1, 0.25) = 1
    #   v=0.2, old 0, R=-1: inside the range -> 1.2^2 = 1.44 (both terms)
    #   v=0,   old 1, R=1:  clip 0.5 -> max(1, 0.25) = 1
    loss, clipped = clipped_value_loss(
        torch.tensor([[2.0, 0.2, 0.0]]),
        torch.tensor([[0.0, 0.0, 1.0]]),
        torch.tensor([[1.0, -1.0, 1.0]]),
        0.5,
    )
    torch.testing.assert_close(loss, 0.5 * torch.tensor([[1.0, 1.44, 1.0]]))
    assert clipped.tolist() == [[False, False, False]]
    #   v=-1, old 0, R=1: clip -0.5 -> max(4, 2.25) = 4: the unclipped term
    #   v=2,  old 0, R=2: clip 0.5  -> max(0, 2.25) = 2.25: the clipped term keeps the step small
    loss, clipped = clipped_value_loss(
        torch.tensor([[-1.0, 2.0]]), torch.zeros(1, 2), torch.tensor([[1.0, 2.0]]), 0.5
    )
    torch.testing.assert_close(loss, 0.5 * torch.tensor([[4.0, 2.25]]))
    assert clipped.tolist() == [[False, True]]


def test_loss_fn_metrics_and_mini_batch_share():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    vpreds = torch.tensor([[2.0, 0.0, 9.0], [0.3, 5.0, 5.0]], requires_grad=True)
    batch = Batch(
        {
            "response_mask": mask,
            "values": torch.zeros(2, 3),
            "returns": torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        }
    )
    # real tokens: 0.5 * 2.25 (clipped) = 1.125, 0, 0.5 * 0.09 = 0.045 -> token-mean 1.17 / 3
    loss, metrics = loss_fn_for()(batch, vpreds)
    assert float(loss.detach()) == pytest.approx(1.17 / 3)
    assert metrics["critic/vf_loss"] == pytest.approx(1.17 / 3)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["critic/vpred_mean"] == pytest.approx((2.0 + 0.0 + 0.3) / 3)
    # a micro-batch of a mini-batch with 6 real tokens (all ranks): its share of that loss
    batch.meta["loss_norm"] = {"num_seqs": 4.0, "num_tokens": 6.0, "max_len": 3}
    share, metrics = loss_fn_for()(batch, vpreds)
    assert float(share.detach()) == pytest.approx(1.17 / 6)
    assert metrics["critic/vf_loss"] == pytest.approx(1.17 / 3)  # the micro-batch's own
    share.backward()
    assert vpreds.grad is not None and (vpreds.grad[mask == 0] == 0).all()
    assert vpreds.grad[0, 0] == 0  # the clipped term is constant in v


def test_the_aggregation_follows_critic_loss_agg_mode():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    batch = Batch(
        {"response_mask": mask, "values": torch.zeros(2, 2), "returns": torch.zeros(2, 2)}
    )
    vpreds = torch.tensor([[0.2, 0.2], [0.4, 0.0]])  # per token 0.02, 0.02 | 0.08
    loss, _ = loss_fn_for("seq-mean-token-mean", cliprange=1.0)(batch, vpreds)
    assert float(loss) == pytest.approx((0.02 + 0.08) / 2)
    loss, _ = loss_fn_for("token-mean", cliprange=1.0)(batch, vpreds)
    assert float(loss) == pytest.approx(0.12 / 3)
