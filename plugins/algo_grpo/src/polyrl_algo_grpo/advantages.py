"""Outcome advantages that compare the samples drawn for one prompt (no critic).

Each response gets one score, the sum of its token-level rewards (the verifier's reward sits on
the last token; a KL penalty in the reward is spread over the tokens and summed in too). The
score is compared within its group (rows sharing a ``uid``), and the resulting scalar is
broadcast to every response token (zero on padding). ``returns`` equal the advantages: there is
no value function to fit.

Groups of one sample: there is nothing to compare with. GRPO does as verl's
``compute_grpo_outcome_advantage`` does: a group of one has mean 0 and std 1, so its advantage is
its raw score (over ``1 + 1e-6`` with the std) -- a REINFORCE term without baseline whose sign
follows the reward's offset (with 0/1 rewards it can only push probabilities up). That is what a
verl user running GRPO with ``rollout.n=1`` gets, and ``polyrl validate`` says so in a notice
(``polyrl_algo_grpo.plugin.GROUPS_OF_ONE``). The other estimators here give a group of one 0,
the limit of their formulas (the group mean of one score is the score itself; RLOO has no
"others"), and need ``rollout.n >= 2``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from polyrl_algo_grpo.grouping import GroupStats, group_stats

if TYPE_CHECKING:
    from polyrl.api import Batch

GRPO_EPSILON = 1e-6


def _check(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            "token_level_rewards and response_mask must both be [B, T], got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )


def _scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    mask = response_mask.to(token_level_rewards.dtype)
    return torch.where(mask != 0, token_level_rewards * mask, 0.0).sum(dim=-1)


def group_outcome_advantage(
    batch: Batch,
    centre: Callable[[torch.Tensor, GroupStats], torch.Tensor],
    singletons: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The frame every estimator here shares: one float64 score per response, the statistics of
    its group (``batch["uid"]``), ``centre(scores, stats)`` (the estimator's own formula; for a
    group of one it is used with ``singletons``, else such a group gets 0), broadcast to the
    response tokens (0 on padding); ``returns`` equal the advantages."""
    token_level_rewards = batch["token_level_rewards"]
    response_mask = batch["response_mask"]
    _check(token_level_rewards, response_mask)
    scores = _scores(token_level_rewards, response_mask).to(torch.float64)
    stats = group_stats(scores, batch["uid"])
    centred = centre(scores, stats)
    if not singletons:
        centred = torch.where(stats.size > 1, centred, 0.0)
    dtype = token_level_rewards.dtype
    adv = centred.to(dtype).unsqueeze(-1) * response_mask.to(dtype)
    return adv, adv.clone()


@torch.no_grad()
def grpo_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al., 2024): ``(s - mean_g) / (std_g + 1e-6)`` with the unbiased group std,
    or ``s - mean_g`` when ``algorithm.norm_adv_by_std_in_grpo`` is false.

    A group whose scores are all equal (all right, all wrong) gets advantage 0: it carries no
    signal. A group of one has mean 0 and std 1, as in verl: its advantage is its raw score
    (see the module doc).
    """
    by_std = bool(config.norm_adv_by_std_in_grpo)

    def centre(scores: torch.Tensor, stats: GroupStats) -> torch.Tensor:
        one = stats.size == 1
        centred = scores - torch.where(one, 0.0, stats.mean)
        return centred / (torch.where(one, 1.0, stats.std) + GRPO_EPSILON) if by_std else centred

    return group_outcome_advantage(batch, centre, singletons=True)


@torch.no_grad()
def drgrpo_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr.GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training"): ``s - mean_g``.

    Dividing by the group std up-weights prompts that are nearly always solved or failed (small
    std), a difficulty bias; Dr.GRPO drops it, and pairs this with the ``seq-mean-token-sum-norm``
    aggregation (set by the ``drgrpo`` algorithm's config defaults) to remove the length bias too.
    ``config`` has no knob for it: ``norm_adv_by_std_in_grpo`` is ignored.
    """
    return group_outcome_advantage(batch, lambda scores, stats: scores - stats.mean)


@torch.no_grad()
def rloo_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al., 2024): ``s_i - mean of the other n-1 scores of the group``.

    The leave-one-out baseline does not depend on the sample itself, so the estimate stays
    unbiased; it equals ``n/(n-1) * (s_i - mean_g)``. A singleton has no others: advantage 0.
    """

    def centre(scores: torch.Tensor, stats: GroupStats) -> torch.Tensor:
        others = (stats.total - scores) / (stats.size - 1).clamp_min(1)
        return scores - others

    return group_outcome_advantage(batch, centre)
