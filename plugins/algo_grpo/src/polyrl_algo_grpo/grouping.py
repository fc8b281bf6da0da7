"""Per-group statistics of one score per response, for estimators that compare the samples of
one prompt. Groups are given as the batch's ``uid`` column: one id per row (any hashable: the
prompt's uid string, an int ...); rows need not be contiguous."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class GroupStats:
    """For each ROW: its group's size, sum, mean and unbiased std (0 for a group of one)."""

    size: torch.Tensor
    total: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor


def group_ids(index: np.ndarray | Sequence[Any], rows: int) -> torch.Tensor:
    """Dense group numbers ``0..G-1`` for the ids in ``index`` (order of first appearance)."""
    if isinstance(index, torch.Tensor):  # tensor elements hash by identity, not value
        index = index.tolist()
    ids = list(np.asarray(index, dtype=object).reshape(-1)) if index is not None else []
    if len(ids) != rows:
        raise ValueError(
            f"uid has {len(ids)} group ids but the batch has {rows} responses; give one id "
            f"per response (rows sampled from the same prompt share it)"
        )
    numbers: dict[Any, int] = {}
    return torch.tensor([numbers.setdefault(i, len(numbers)) for i in ids], dtype=torch.long)


def group_stats(scores: torch.Tensor, index: np.ndarray | Sequence[Any]) -> GroupStats:
    """Statistics of ``scores[B]`` per group, gathered back to rows. Computed in float64 so that
    a group of equal scores has a std of exactly 0 (its advantages are then exactly 0)."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be one value per response, got shape {tuple(scores.shape)}")
    gid = group_ids(index, scores.shape[0]).to(scores.device)
    n_groups = int(gid.max().item()) + 1 if gid.numel() else 0
    values = scores.detach().to(torch.float64)
    size = torch.zeros(n_groups, dtype=torch.float64, device=scores.device)
    size.index_add_(0, gid, torch.ones_like(values))
    total = torch.zeros_like(size).index_add_(0, gid, values)
    mean = total / size
    squares = torch.zeros_like(size).index_add_(0, gid, (values - mean[gid]) ** 2)
    std = torch.where(size > 1, torch.sqrt(squares / (size - 1).clamp_min(1)), 0.0)
    return GroupStats(size=size[gid], total=total[gid], mean=mean[gid], std=std[gid])
