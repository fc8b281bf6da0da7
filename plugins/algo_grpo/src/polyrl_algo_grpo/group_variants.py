"""More outcome estimators that compare the samples of one prompt, as verl registers them:
Pass@k training (``grpo_passk``), OPO's length-weighted baseline (``opo``) and GPG's rescaled
group mean (``gpg``). They share the frame of :mod:`polyrl_algo_grpo.advantages`: one score
per response, its group's statistics, a scalar per response broadcast over its tokens, and a
singleton group giving 0 (verl's singletons keep their raw score; see that module's doc).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl_algo_grpo.advantages import GRPO_EPSILON, group_outcome_advantage
from polyrl_algo_grpo.grouping import GroupStats, group_ids

if TYPE_CHECKING:
    from polyrl.api import Batch

GPG_F_NORM = 1.0  # verl's f_norm: GPG's advantage scale, fixed there too


@torch.no_grad()
def grpo_passk_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training (Chen et al., 2025, arXiv 2503.19595): only the best response of a group
    learns, with advantage ``best - second best`` (divided by the group's std + 1e-6 unless
    ``algorithm.norm_adv_by_std_in_grpo`` is false); every other response gets 0.

    A tie for the best gives 0 to all (the gap is 0); the first best row is the one credited.
    """
    by_std = bool(config.norm_adv_by_std_in_grpo)
    uid = batch["uid"]

    def centre(scores: torch.Tensor, stats: GroupStats) -> torch.Tensor:
        gid = group_ids(uid, len(scores)).to(scores.device)
        out = torch.zeros_like(scores)
        for group in range(int(gid.max().item()) + 1 if len(gid) else 0):
            rows = torch.nonzero(gid == group).squeeze(-1)
            if len(rows) < 2:
                continue
            top = torch.topk(scores[rows], 2)
            gap = top.values[0] - top.values[1]
            best = rows[torch.nonzero(scores[rows] == top.values[0])[0, 0]]
            out[best] = gap / (stats.std[best] + GRPO_EPSILON) if by_std else gap
        return out

    return group_outcome_advantage(batch, centre)


@torch.no_grad()
def opo_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al., 2025, arXiv 2505.23585, "On-Policy RL with Optimal reward Baseline"):
    ``s_i - sum_j |y_j| s_j / sum_j |y_j|`` over the group: the baseline weighs each sample by
    its response length, the variance-optimal baseline for a sequence-level reward under exact
    on-policy training."""
    lengths = batch["response_mask"].sum(dim=-1).to(torch.float64)
    uid = batch["uid"]

    def centre(scores: torch.Tensor, stats: GroupStats) -> torch.Tensor:
        gid = group_ids(uid, len(scores)).to(scores.device)
        groups = int(gid.max().item()) + 1 if len(gid) else 0
        weighted = torch.zeros(groups, dtype=scores.dtype).index_add_(0, gid, lengths * scores)
        total = torch.zeros(groups, dtype=scores.dtype).index_add_(0, gid, lengths)
        return scores - (weighted / total.clamp_min(1))[gid]

    return group_outcome_advantage(batch, centre)


@torch.no_grad()
def gpg_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al., 2025, arXiv 2504.02546): ``alpha * (s_i - mean_g) / f_norm`` with
    ``alpha = B / (number of responses whose score is not 0)`` over the whole batch: groups
    where every sample scored 0 contribute no gradient, and alpha restores the scale the rest
    would have had. ``f_norm`` is 1 (verl has no key for it)."""

    def centre(scores: torch.Tensor, stats: GroupStats) -> torch.Tensor:
        alpha = len(scores) / max(int(torch.count_nonzero(scores).item()), 1)
        return alpha * (scores - stats.mean) / GPG_F_NORM

    return group_outcome_advantage(batch, centre)
