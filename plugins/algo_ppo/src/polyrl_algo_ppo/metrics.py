"""verl's metrics of a critic's values, from the step's batch (on the driver)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from polyrl.api import Batch


def value_metrics(batch: Batch) -> dict[str, float]:
    """``critic/values/{mean,max,min}`` over the real response tokens, and
    ``critic/vf_explained_var = 1 - var(returns - values) / (var(returns) + 1e-5)``: near 1 when
    the values predict the returns, 0 (or below) when they explain nothing."""
    real = batch["response_mask"].bool()
    values, returns = batch["values"][real].float(), batch["returns"][real].float()
    if values.numel() == 0:
        return {}
    metrics = {
        "critic/values/mean": float(values.mean()),
        "critic/values/max": float(values.max()),
        "critic/values/min": float(values.min()),
    }
    if values.numel() > 1:  # torch.var is the unbiased variance, as in verl
        residual = (returns - values).var()
        metrics["critic/vf_explained_var"] = float(1.0 - residual / (returns.var() + 1e-5))
    return metrics
