"""How far the rollout engine's sampling probabilities are from the trainer's for the same tokens
(verl's ``training/rollout_probs_diff_*``): near zero when weight sync and numerics agree; a
growing gap means the sampler runs stale or different weights.

Per response token: ``|exp(rollout_log_probs) - exp(trainer log-probs)|``; the metrics are the
mean over every response token of the batch and the largest gap.

Two places have both log-probs: the ``old_log_prob`` stage on the driver (:func:`gap_metrics` on
the whole batch), and, on a step whose old log-probs are skipped (an on-policy update), the
actor's update, whose forward pass gives the current log-probs (which are the old ones). There
each data-parallel rank sees its shard in micro-batches, so it returns the parts of the metrics
(:class:`GapTally`: token sum, token count, largest gap, under :data:`PART_KEYS`) and the driver
combines the ranks' parts (:func:`combine_parts`): the mean is then over all tokens of the batch
(a mean of per-rank means would weigh a short shard like a long one) and the max the largest on
any rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

DIFF_MEAN = "training/rollout_probs_diff_mean"
DIFF_MAX = "training/rollout_probs_diff_max"

SUM_KEY = "rollout_probs_diff/sum"
TOKENS_KEY = "rollout_probs_diff/tokens"
MAX_KEY = "rollout_probs_diff/max"
PART_KEYS = (SUM_KEY, TOKENS_KEY, MAX_KEY)


def token_gaps(
    rollout_log_probs: torch.Tensor, log_probs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """The gap of every response token (a flat tensor over the masked positions)."""
    mask = response_mask.bool()
    trainer = log_probs.detach().float().exp()
    return (rollout_log_probs.detach().float().exp() - trainer).abs()[mask]


def gap_metrics(
    rollout_log_probs: torch.Tensor, log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Mean and max gap over the response tokens; empty without a response token."""
    gaps = token_gaps(rollout_log_probs, log_probs, response_mask)
    if gaps.numel() == 0:
        return {}
    return {DIFF_MEAN: float(gaps.mean()), DIFF_MAX: float(gaps.max())}


class GapTally:
    """The parts of the gap metrics over the micro-batches one rank trains on. The running
    sums stay on the micro-batches' device until :meth:`parts` (no host sync per micro-batch)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | float = 0.0
        self.tokens: torch.Tensor | float = 0.0
        self.largest: torch.Tensor | float = 0.0

    def add(
        self, rollout_log_probs: torch.Tensor, log_probs: torch.Tensor, response_mask: torch.Tensor
    ) -> None:
        mask = response_mask.to(device=log_probs.device, dtype=torch.float32)
        trainer = log_probs.detach().float().exp()
        gaps = (rollout_log_probs.detach().float().exp() - trainer).abs() * mask  # 0 off-mask
        if gaps.numel() == 0:
            return
        self.total = self.total + gaps.sum()
        self.tokens = self.tokens + mask.sum()
        self.largest = torch.maximum(torch.as_tensor(self.largest, device=gaps.device), gaps.max())

    def parts(self) -> dict[str, float]:
        return {
            SUM_KEY: float(self.total),
            TOKENS_KEY: float(self.tokens),
            MAX_KEY: float(self.largest),
        }


def combine_parts(per_rank: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The gap metrics from the parts in the ranks' update metrics, which are removed from
    them (they are not metrics themselves); empty when no rank reported a response token."""
    total, tokens, largest = 0.0, 0.0, 0.0
    for metrics in per_rank:
        if SUM_KEY not in metrics:
            continue
        total += float(metrics.pop(SUM_KEY))
        tokens += float(metrics.pop(TOKENS_KEY))
        largest = max(largest, float(metrics.pop(MAX_KEY)))
    if tokens == 0:
        return {}
    return {DIFF_MEAN: total / tokens, DIFF_MAX: largest}
