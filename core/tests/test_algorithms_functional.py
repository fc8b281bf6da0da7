"""Masked statistics against values worked out by hand."""

import math

import pytest
import torch

from polyrl.algorithms import masked_mean, masked_sum, masked_var, masked_whiten

torch.set_num_threads(1)

# Two rows; masked-in values are 1, 2 (row 0) and 4 (row 1). The 3/5/6 are padding.
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_masked_sum_and_mean_over_all_and_rows():
    # all: 1 + 2 + 4 = 7 ; rows: [1+2, 4] = [3, 4]
    assert masked_sum(VALUES, MASK).item() == pytest.approx(7.0)
    assert masked_sum(VALUES, MASK, dim=-1).tolist() == pytest.approx([3.0, 4.0])
    # mean: 7 / 3 ; rows: [3/2, 4/1]
    assert masked_mean(VALUES, MASK).item() == pytest.approx(7 / 3)
    assert masked_mean(VALUES, MASK, dim=-1).tolist() == pytest.approx([1.5, 4.0])


def test_padding_nan_or_inf_does_not_leak():
    values = VALUES.clone()
    values[0, 2] = float("nan")
    values[1, 2] = float("inf")
    assert masked_sum(values, MASK).item() == pytest.approx(7.0)
    assert masked_mean(values, MASK).item() == pytest.approx(7 / 3)


def test_empty_row_mean_is_zero_not_nan():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # row 0: (1+2)/2 = 1.5 ; row 1 has no tokens -> 0
    assert masked_mean(VALUES, mask, dim=-1).tolist() == pytest.approx([1.5, 0.0])
    assert masked_mean(VALUES, torch.zeros_like(mask)).item() == 0.0


def test_masked_var_biased_and_unbiased():
    # mean 7/3; deviations -4/3, -1/3, 5/3; squares 16/9 + 1/9 + 25/9 = 42/9
    # biased: 42/9 / 3 = 14/9 ; unbiased: 42/9 / 2 = 7/3
    assert masked_var(VALUES, MASK, unbiased=False).item() == pytest.approx(14 / 9)
    assert masked_var(VALUES, MASK, unbiased=True).item() == pytest.approx(7 / 3)


def test_masked_var_refuses_too_few_elements():
    one = torch.tensor([[1, 0, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(VALUES, one, unbiased=True)
    assert masked_var(VALUES, one, unbiased=False).item() == 0.0


def test_masked_whiten():
    # (x - 7/3) / sqrt(7/3): x=1 -> (-4/3)/1.5275252 = -0.8728716
    out = masked_whiten(VALUES, MASK)
    assert out[0, 0].item() == pytest.approx(-(4 / 3) / math.sqrt(7 / 3), rel=1e-5)
    assert out[1, 0].item() == pytest.approx((5 / 3) / math.sqrt(7 / 3), rel=1e-5)
    assert masked_mean(out, MASK).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(out, MASK).item() == pytest.approx(1.0, rel=1e-5)
    # shift_mean=False keeps the mean, only rescales: whitened + 7/3
    kept = masked_whiten(VALUES, MASK, shift_mean=False)
    assert kept[0, 0].item() == pytest.approx(7 / 3 - (4 / 3) / math.sqrt(7 / 3), rel=1e-5)


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="same shape"):
        masked_sum(VALUES, MASK[:, :2])
