"""Loss aggregation modes and micro-batch normalisation, against hand-computed values."""

import pytest
import torch

from polyrl.algorithms import LOSS_AGG_MODES, agg_loss, loss_norm_totals
from polyrl.errors import ConfigError

torch.set_num_threads(1)

# Row 0 has tokens 1, 2, 3 (the 4 is padding); row 1 has tokens 5, 6.
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_token_mean():
    # (1+2+3 + 5+6) / 5 tokens = 17/5
    assert agg_loss(LOSS, MASK, "token-mean").item() == pytest.approx(3.4)
    # mini-batch has 10 tokens: 17/10
    assert agg_loss(LOSS, MASK, "token-mean", num_tokens=10).item() == pytest.approx(1.7)


def test_token_sum():
    # 1+2+3 + 5+6; micro-batches need no denominator; with 4 data-parallel ranks each rank's
    # share is scaled by 4, so the gradient average over the ranks is the sum of their sums
    assert agg_loss(LOSS, MASK, "token-sum").item() == pytest.approx(17.0)
    assert agg_loss(LOSS, MASK, "token-sum", num_tokens=10, num_seqs=4).item() == 17.0
    assert agg_loss(LOSS, MASK, "token-sum", dp_size=4).item() == pytest.approx(68.0)
    assert agg_loss(LOSS, MASK, "token-mean", dp_size=4).item() == pytest.approx(3.4)


def test_seq_mean_token_sum():
    # (6 + 11) / 2 sequences
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(8.5)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", num_seqs=4).item() == pytest.approx(4.25)


def test_seq_mean_token_mean():
    # (6/3 + 11/2) / 2 = (2 + 5.5) / 2
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(3.75)
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean", num_seqs=5).item() == pytest.approx(1.5)


def test_seq_mean_token_sum_norm():
    # Dr.GRPO: 17 / (2 seqs * width 4) = 2.125 ; with max_len 10: 17 / 20
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(2.125)
    out = agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", max_len=10)
    assert out.item() == pytest.approx(0.85)
    out = agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", num_seqs=4, max_len=10)
    assert out.item() == pytest.approx(17 / 40)


def test_all_padding_rows_do_not_count_as_sequences():
    loss = torch.cat([LOSS, torch.full((1, 4), 100.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=MASK.dtype)])
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(8.5)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.75)
    assert loss_norm_totals(mask) == {"num_seqs": 2, "num_tokens": 5, "max_len": 4}
    assert loss_norm_totals(mask, max_len=16)["max_len"] == 16


def test_empty_mask_gives_zero_with_a_graph():
    loss = LOSS.clone().requires_grad_(True)
    for mode in LOSS_AGG_MODES:
        out = agg_loss(loss, torch.zeros_like(MASK), mode)
        assert out.item() == 0.0
        out.backward()
        assert torch.all(loss.grad == 0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_sum_to_the_mini_batch_loss(mode):
    # Rows of very different lengths, so normalising each micro-batch by itself would be wrong.
    gen = torch.Generator().manual_seed(0)
    loss = torch.randn(4, 6, generator=gen)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]
    )
    whole = agg_loss(loss, mask, mode)
    totals = loss_norm_totals(mask)
    parts = [
        agg_loss(loss[i : i + 2, :w], mask[i : i + 2, :w], mode, **totals)
        for i, w in ((0, 6), (2, 3))  # the second micro-batch is also narrower (trimmed padding)
    ]
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), rel=1e-6)
    if mode == "token-mean":
        # the naive average of per-micro-batch means is different: (7 tokens vs 5 tokens)
        naive = (agg_loss(loss[:2], mask[:2], mode) + agg_loss(loss[2:], mask[2:], mode)) / 2
        assert naive.item() != pytest.approx(whole.item(), rel=1e-3)


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm") as info:
        agg_loss(LOSS, MASK, "token-median")
    assert isinstance(info.value, ConfigError)


def test_non_positive_denominator_is_refused():
    with pytest.raises(ValueError, match="num_tokens"):
        agg_loss(LOSS, MASK, "token-mean", num_tokens=0)
