"""verl's rollout correction (Liu, Li, Fu et al., 2025, "When Speed Kills Stability"): the
importance weights and rejection masks between the policy being trained and the rollout
engine's sampling policy, and their diagnostics, computed as verl computes them so that its
settings mean the same here and its metrics (``rollout_corr/*``) read the same.

With ``log r = log pi - log pi_rollout`` per token (clamped to +-20 before any ``exp``):

- weights, ``rollout_is``: ``token``: ``w_t = min(r_t, C)``; ``sequence``: one weight per
  response, ``min(prod_t r_t, C)``; ``C`` is ``rollout_is_threshold``. With
  ``rollout_is_batch_normalize`` they are divided by their mean (over tokens, or over
  responses), so they re-weight without rescaling the loss;
- rejection, ``rollout_rs``: per criterion, a divergence per token (``k1 = -log r``,
  ``k2 = (log r)^2 / 2``, ``k3 = r - 1 - log r``), judged per token or as its sum, mean or max
  over the response; a token or response outside the bounds leaves the loss (every criterion
  must pass).

Everything here is without gradient: the weights change the measure, not the objective.
"""

from __future__ import annotations

import math

import torch

from polyrl.api import masked_mean
from polyrl_loss_zoo.correction_config import Correction, Criterion
from polyrl_loss_zoo.ratios import LOG_RATIO_CLAMP

PREFIX = "rollout_corr/"


def _masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    kept = torch.where(mask != 0, values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(values.masked_fill(mask == 0, float("-inf")).max())


def _masked_min(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(values.masked_fill(mask == 0, float("inf")).min())


def _clamped_std(values: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> float:
    """verl's spread of a statistic: the masked standard deviation of it clamped to
    ``[low, high]`` (0 with one token or none)."""
    if float(mask.sum()) <= 1:
        return 0.0
    clamped = values.clamp(min=low, max=high)
    mean = masked_mean(clamped, mask)
    variance = masked_mean(clamped.square(), mask) - mean.square()
    return float(torch.sqrt(variance.clamp(min=0.0)))


def _spread(seq_values: torch.Tensor) -> float:
    return float(seq_values.std()) if seq_values.numel() > 1 else 0.0


def is_weights(
    log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold: float, normalize: bool
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights ``[B, T]`` (0 on padding) and verl's ``rollout_is_*``
    metrics (of the weights before truncation; spread and effective sample size of the weights
    clamped to ``[1/C, C]``)."""
    if level == "token":
        stat_log_ratio = log_ratio
        weights = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    else:
        stat_log_ratio = _masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1)  # [B, 1]
        clamped = stat_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        weights = torch.exp(clamped).expand_as(log_ratio)
    weights = weights * mask
    metrics = _is_metrics(weights, stat_log_ratio, mask, level, threshold)
    weights = weights.clamp(max=threshold)
    if normalize:
        if level == "token":
            mean = masked_mean(weights, mask)
        else:
            per_row = masked_mean(weights, mask, dim=-1)
            has_tokens = (mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = (per_row * has_tokens).sum() / has_tokens.sum().clamp_min(1e-8)
        if float(mean) > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = float(mean)
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _is_metrics(
    weights: torch.Tensor,
    stat_log_ratio: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    threshold: float,
) -> dict[str, float]:
    lower = 1.0 / threshold
    metrics: dict[str, float] = {"rollout_is_mean": float(masked_mean(weights, mask))}
    if level == "sequence":
        log_max, log_min = stat_log_ratio.max(), stat_log_ratio.min()
        metrics["rollout_is_max"] = float(torch.exp(log_max.clamp(max=LOG_RATIO_CLAMP)))
        metrics["rollout_is_min"] = float(torch.exp(log_min))
        high = (stat_log_ratio > math.log(threshold)).float().mean()
        low = (stat_log_ratio < math.log(lower)).float().mean()
    else:
        metrics["rollout_is_max"] = _masked_max(weights, mask)
        metrics["rollout_is_min"] = _masked_min(weights, mask)
        high = masked_mean((weights > threshold).float(), mask)
        low = masked_mean((weights < lower).float(), mask)
    metrics["rollout_is_ratio_fraction_high"] = float(high)
    metrics["rollout_is_ratio_fraction_low"] = float(low)
    metrics["rollout_is_std"] = _clamped_std(weights, mask, lower, threshold)
    clamped = weights.clamp(min=lower, max=threshold)
    normalized = clamped / (masked_mean(clamped, mask) + 1e-8)
    metrics["rollout_is_eff_sample_size"] = 1.0 / float(masked_mean(normalized.square(), mask))
    per_row = masked_mean(weights, mask, dim=-1)
    metrics["rollout_is_seq_mean"] = float(per_row.mean())
    metrics["rollout_is_seq_std"] = _spread(per_row)
    metrics["rollout_is_seq_max"] = float(per_row.max())
    metrics["rollout_is_seq_min"] = float(per_row.min())
    metrics["rollout_is_seq_max_deviation"] = float((per_row - 1.0).abs().max())
    metrics["rollout_is_seq_fraction_high"] = float((per_row > threshold).float().mean())
    metrics["rollout_is_seq_fraction_low"] = float((per_row < lower).float().mean())
    return metrics


def _divergences(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-token divergence estimators of ``pi_rollout`` from ``pi``, by name."""
    safe = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return {"k1": -safe, "k2": 0.5 * safe.square(), "k3": torch.exp(safe) - 1.0 - safe}


def _sequence_statistic(values: torch.Tensor, mask: torch.Tensor, reduce: str) -> torch.Tensor:
    """``[B]``: the sum, mean or max of ``values`` over each response (max of none: 0)."""
    if reduce == "sum":
        return _masked_sum(values, mask, dim=-1)
    if reduce == "mean":
        return _masked_sum(values, mask, dim=-1) / (mask.sum(dim=-1) + 1e-8)
    peak = values.masked_fill(mask == 0, float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)


def rejection_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, criteria: tuple[Criterion, ...]
) -> tuple[torch.Tensor, dict[str, float]]:
    """``mask`` with the tokens (token criteria) or whole responses (sequence criteria) that
    fail any criterion set to 0, and verl's ``rollout_rs_*`` metrics, per criterion and in all."""
    divergences = _divergences(log_ratio)
    real = mask != 0
    has_tokens = real.any(dim=-1)
    keep_all = torch.ones_like(mask, dtype=log_ratio.dtype)
    metrics: dict[str, float] = {}
    for criterion in criteria:
        per_token = divergences[criterion.estimator]
        seq_stat = None
        if criterion.token_level:
            stat = per_token
            keep = _within(stat, criterion)
        else:
            seq_stat = _sequence_statistic(per_token, mask, criterion.reduce)
            stat = seq_stat.unsqueeze(-1).expand_as(mask)
            keep = _within(seq_stat, criterion).unsqueeze(-1).expand_as(real)
        keep_float = keep.to(log_ratio.dtype)
        keep_all = keep_all * keep_float
        metrics.update(_rs_metrics(criterion, stat, seq_stat, mask, has_tokens))
        prefix = f"rollout_rs_{criterion.name}"
        metrics[f"{prefix}_masked_fraction"] = float(masked_mean(1.0 - keep_float, mask))
        row_kept = (keep | ~real).all(dim=-1).to(log_ratio.dtype)
        rows = has_tokens.to(log_ratio.dtype)
        metrics[f"{prefix}_seq_masked_fraction"] = (
            float(((1.0 - row_kept) * rows).sum() / rows.sum()) if float(rows.sum()) > 0 else 0.0
        )
    metrics["rollout_rs_masked_fraction"] = float(masked_mean(1.0 - keep_all, mask))
    rejected_rows = ((keep_all <= 0.5) & real).any(dim=-1)
    metrics["rollout_rs_seq_masked_fraction"] = float(rejected_rows.float().mean())
    return (mask * keep_all).to(mask.dtype), metrics


def _within(stat: torch.Tensor, criterion: Criterion) -> torch.Tensor:
    keep = stat <= criterion.upper
    return keep & (stat >= criterion.lower) if criterion.lower is not None else keep


def _rs_metrics(
    criterion: Criterion,
    stat: torch.Tensor,
    seq_stat: torch.Tensor | None,
    mask: torch.Tensor,
    has_tokens: torch.Tensor,
) -> dict[str, float]:
    """verl's statistics of one criterion (``rollout_rs_<name>_*``): of the judged values,
    per response where the criterion is a sequence one."""
    prefix = f"rollout_rs_{criterion.name}"
    upper, lower = criterion.upper, criterion.lower
    seq_values = (seq_stat if seq_stat is not None else masked_mean(stat, mask, dim=-1))[has_tokens]
    metrics = {f"{prefix}_mean": float(masked_mean(stat, mask))}
    if seq_stat is not None:
        metrics[f"{prefix}_max"] = float(seq_values.max())
        metrics[f"{prefix}_min"] = float(seq_values.min())
        high = (seq_values > upper).float().mean()
        low = (seq_values < lower).float().mean() if lower is not None else 0.0
    else:
        metrics[f"{prefix}_max"] = _masked_max(stat, mask)
        metrics[f"{prefix}_min"] = _masked_min(stat, mask)
        high = masked_mean((stat > upper).float(), mask)
        low = masked_mean((stat < lower).float(), mask) if lower is not None else 0.0
    metrics[f"{prefix}_fraction_high"] = float(high)
    metrics[f"{prefix}_fraction_low"] = float(low)
    metrics[f"{prefix}_std"] = _clamped_std(stat, mask, lower if lower is not None else 0.0, upper)
    metrics[f"{prefix}_seq_mean"] = float(seq_values.mean())
    metrics[f"{prefix}_seq_std"] = _spread(seq_values)
    metrics[f"{prefix}_seq_max"] = float(seq_values.max())
    metrics[f"{prefix}_seq_min"] = float(seq_values.min())
    metrics[f"{prefix}_seq_max_deviation"] = float(seq_values.abs().max())
    metrics[f"{prefix}_seq_fraction_high"] = float((seq_values > upper).float().mean())
    if lower is not None:
        metrics[f"{prefix}_seq_fraction_low"] = float((seq_values < lower).float().mean())
    return metrics


def offpolicy_metrics(
    log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """verl's diagnostics of the gap: KL estimators, perplexities of both policies and their
    difference per response, and the chi-square divergence of the token and sequence ratios."""
    log_ratio = log_prob - rollout_log_prob
    trained = masked_mean(log_prob, mask, dim=-1)
    sampled = masked_mean(rollout_log_prob, mask, dim=-1)
    log_ppl_diff = sampled - trained
    safe = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq_log_ratio = _masked_sum(log_ratio, mask, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return {
        "training_ppl": float(torch.exp(-trained).mean()),
        "training_log_ppl": float((-trained).mean()),
        "kl": float(masked_mean(-log_ratio, mask)),
        "k3_kl": float(masked_mean(torch.exp(log_ratio) - log_ratio - 1.0, mask)),
        "rollout_ppl": float(torch.exp(-sampled).mean()),
        "rollout_log_ppl": float((-sampled).mean()),
        "log_ppl_diff": float(log_ppl_diff.mean()),
        "log_ppl_abs_diff": float(log_ppl_diff.abs().mean()),
        "log_ppl_diff_max": float(log_ppl_diff.max()),
        "log_ppl_diff_min": float(log_ppl_diff.min()),
        "ppl_ratio": float(torch.exp(log_ppl_diff).mean()),
        "chi2_token": float(masked_mean(torch.exp(safe).square(), mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq_log_ratio).mean() - 1.0),
    }


@torch.no_grad()
def rollout_correction(
    log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    correction: Correction,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """``(weights or None, the mask after rejection, metrics named rollout_corr/*)`` of the
    policy ``log_prob`` against the rollout's ``rollout_log_prob`` over ``mask``."""
    if not bool((mask != 0).any()):
        raise ValueError("rollout correction needs at least one response token in the batch")
    log_ratio = log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if correction.rollout_is is not None:
        weights, is_metrics = is_weights(
            log_ratio,
            mask,
            correction.rollout_is,
            correction.is_threshold,
            correction.batch_normalize,
        )
        metrics.update(is_metrics)
    kept = mask
    if correction.criteria:
        kept, rs_metrics = rejection_mask(log_ratio, mask, correction.criteria)
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(log_prob, rollout_log_prob, mask))
    return weights, kept, {f"{PREFIX}{name}": value for name, value in metrics.items()}
