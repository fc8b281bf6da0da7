"""Masked reductions over ``[B, T]`` response tensors.

Responses are right-padded, so every statistic an RL loss or estimator takes must ignore the
padding. These helpers take a 0/1 ``mask`` of the same shape (a float weight mask also works for
the sums and means). Padded positions are zeroed with ``torch.where`` before multiplying, so a
NaN or inf sitting in padding (e.g. a log-prob of a pad token) cannot leak into the result.
"""

from __future__ import annotations

import torch


def _zero_padding(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values * mask`` with padded positions forced to exactly zero (NaN-safe)."""
    if values.shape != mask.shape:
        raise ValueError(
            f"values and mask must have the same shape, got {tuple(values.shape)} and "
            f"{tuple(mask.shape)}"
        )
    mask = mask.to(values.dtype)
    return torch.where(mask != 0, values * mask, torch.zeros_like(values))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set, over ``dim`` (all elements when ``None``)."""
    zeroed = _zero_padding(values, mask)
    return zeroed.sum() if dim is None else zeroed.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the masked positions; 0 where nothing is masked in.

    Unlike an ``eps`` in the denominator this is exact for any non-empty mask, and an all-padding
    row gives 0 rather than NaN (so it contributes nothing when summed later).
    """
    total = masked_sum(values, mask, dim)
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim=dim)
    return torch.where(count > 0, total / count.clamp_min(torch.finfo(values.dtype).tiny), 0.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of all masked-in ``values`` (a scalar).

    ``unbiased`` applies Bessel's correction ``n / (n - 1)``, which needs at least two masked-in
    elements; with fewer a ``ValueError`` says so instead of returning inf/NaN.
    """
    count = mask.to(values.dtype).sum()
    if count < 1 or (unbiased and count < 2):
        needed = 2 if unbiased else 1
        raise ValueError(
            f"masked_var needs at least {needed} masked-in element(s), the mask has "
            f"{int(count.item())}; pass unbiased=False or a larger mask"
        )
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Standardise ``values`` by the masked mean and (unbiased) std: ``(x - mu) / sqrt(var + eps)``.

    With ``shift_mean=False`` the mean is added back, so only the scale changes (used when the
    sign of the values carries meaning). Padded positions are returned as computed; multiply by
    the mask if they must be zero.
    """
    mean = masked_mean(values, mask)
    variance = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened
