"""What the losses of this package share: the token log-ratio against the sampling policy,
clamped as verl clamps it, and the masking of padding."""

from __future__ import annotations

import torch

# exp(20) ~ 5e8: far past any clip or gate, still finite in float32 and bf16.
LOG_RATIO_CLAMP = 20.0


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_old`` clamped to +-20, so ``exp`` of it never overflows."""
    return torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def on_response(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with padding set to exactly 0 (no NaN or inf from padded positions leaks)."""
    return torch.where(mask != 0, values, torch.zeros_like(values))


def row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean over the response tokens ``[B]``, with verl's ``1e-8`` in the denominator
    (an empty row gives 0)."""
    mask = mask.to(values.dtype)
    return (on_response(values, mask)).sum(dim=-1) / (mask.sum(dim=-1) + 1e-8)
