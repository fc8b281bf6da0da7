"""Which groups dynamic sampling keeps, and how many of them a step can train on.

A group (the samples of one prompt, sharing a ``uid``) whose filter metric is the same for every
sample gets zero advantage from every group-relative estimator: it costs an update's compute and
dilutes the batch without teaching anything. DAPO drops such groups. "The same" is exact
equality here; verl tests ``np.std(values) > 0``, which float rounding can make true for equal
values (three scores of 0.1 have a std of about 1e-17).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polyrl.api import Batch, ConfigError, RewardResult

# Filter metrics computed from the batch (verl's names); any other name is read from the reward.
SEQUENCE_METRICS = {"seq_reward": "token_level_scores", "seq_final_reward": "token_level_rewards"}


def metric_values(batch: Batch, results: Sequence[RewardResult], metric: str) -> np.ndarray:
    """One value per row: a sum over the response's tokens (``seq_reward``: scores,
    ``seq_final_reward``: rewards after shaping), the reward's ``score``, or a named extra the
    reward returned for every sample (``acc`` from a math scorer)."""
    if metric in SEQUENCE_METRICS:
        return batch[SEQUENCE_METRICS[metric]].sum(-1).double().numpy()
    if len(results) != len(batch):
        raise ConfigError(
            f"algorithm.filter_groups.metric={metric!r} needs the reward provider's result of "
            f"every sample, but the reward stage scored {len(results)} of {len(batch)}; filter "
            f"on seq_reward or seq_final_reward instead"
        )
    if metric == "score":
        return np.array([r.score for r in results], dtype=np.float64)
    missing = [r for r in results if metric not in r.extra]
    if missing:
        offered = sorted(missing[0].extra)
        raise ConfigError(
            f"algorithm.filter_groups.metric={metric!r}: the reward returned no {metric!r} for "
            f"{len(missing)} of {len(results)} samples (it returns {offered or 'no extras'}); "
            f"use score, seq_reward, seq_final_reward or one of those"
        )
    return np.array([r.extra[metric] for r in results], dtype=np.float64)


def rows_by_group(uids: Any) -> dict[Any, list[int]]:
    """The rows of each group, groups in order of first appearance."""
    rows_of: dict[Any, list[int]] = {}
    for row, uid in enumerate(np.asarray(uids, dtype=object)):
        rows_of.setdefault(uid, []).append(row)
    return rows_of


@dataclass(frozen=True)
class GroupVerdict:
    """Rows to keep, and the number of groups kept and dropped."""

    keep_rows: np.ndarray
    kept: int
    dropped: int


def groups_with_spread(uids: Any, values: np.ndarray) -> GroupVerdict:
    """Keep the rows of every group whose ``values`` are not all equal; a group of one sample is
    kept (there is nothing to compare it with, as in verl)."""
    rows_of = rows_by_group(uids)
    keep = np.zeros(len(values), dtype=bool)
    kept = 0
    for rows in rows_of.values():
        group = values[rows]
        if len(rows) == 1 or group.min() != group.max():
            keep[rows] = True
            kept += 1
    return GroupVerdict(keep, kept, len(rows_of) - kept)


def first_groups(uids: Any, limit: int, dp_size: int) -> np.ndarray:
    """Rows of the first ``g <= limit`` groups (in order of appearance) for the largest ``g``
    whose row count splits evenly over ``dp_size`` data-parallel ranks: whole groups, because
    the advantage compares a group's samples; an even split, because every rank must take the
    same optimizer steps (:mod:`polyrl.step.minibatch`). Empty when no such ``g > 0`` exists."""
    groups = list(rows_by_group(uids).values())[:limit]
    while groups and sum(len(rows) for rows in groups) % dp_size:
        groups.pop()
    return np.array([row for rows in groups for row in rows], dtype=np.int64)
