"""verl's optimal token baselines (``optimal_token_baseline``, ``tir_optimal_token_baseline``):
a baseline per response position instead of one per response.

Within a prompt's group, the baseline of position ``t`` is ``B_t = sum_i G_it W_it / (sum_i W_it
+ 1e-8)``: the group's returns-to-go ``G`` weighted by each trajectory's cumulative path
variance ``W_it = sum_{j<=t} (1 - 2 pi_ij + sum_pi_squared_ij)`` (``pi``: the probability of the
sampled token under the old policy, ``exp(old_log_probs)``; ``sum_pi_squared``: the sum over the
vocabulary of squared probabilities, which the actor computes with
``actor_rollout_ref.actor.calculate_sum_pi_squared=true``). With verl's rollout correction the
per-token terms are scaled by the squared importance weights (``rollout_is_weights``) first.
The advantage is ``G - B``; the returns are ``G``. A group of one keeps its returns (no
baseline).

``tir_optimal_token_baseline`` (tool-integrated reasoning) does the same on the response's
own tokens only: position ``t`` is a trajectory's ``t``-th token of ``response_mask``, so that
in multi-turn trajectories the tool outputs between turns (masked out) do not misalign the
positions compared across a group, and responses without a token take no part.

Both apply verl's zero tail, which verl's trainer always leaves on (it passes no value, and
both functions default to it): where one trajectory of a group is strictly the longest, its
baseline is 0 past the second-longest one's length (no other trajectory informs it there).
verl has no config key for it nor for the 1e-8, so neither has polyrl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl_algo_grpo.grouping import group_ids

if TYPE_CHECKING:
    from polyrl.api import Batch

EPSILON = 1e-8  # verl's epsilon of the baseline's denominator
SWITCH = "actor_rollout_ref.actor.calculate_sum_pi_squared"


def check_otb_config(cfg: Any) -> list[str]:
    """The estimators read ``sum_pi_squared``, which only the switch makes the actor compute
    (verl asserts the same when the advantages are computed)."""
    if bool(cfg.actor_rollout_ref.actor.calculate_sum_pi_squared):
        return []
    return [
        f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} reads sum_pi_squared, which "
        f"the actor computes only with {SWITCH}=true (as in verl): set it"
    ]


@torch.no_grad()
def optimal_token_baseline_advantage(
    batch: Batch, config: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``optimal_token_baseline``: positions are the response's columns."""
    mask = batch["response_mask"].to(batch["token_level_rewards"].dtype)
    returns, variance = _returns_and_path_variance(batch, mask)
    rows = torch.arange(mask.shape[0])
    baselines = _group_baselines(returns, variance, mask, batch["uid"], rows)
    return (returns - baselines) * mask, returns


@torch.no_grad()
def tir_optimal_token_baseline_advantage(
    batch: Batch, config: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``tir_optimal_token_baseline``: positions are the response's own tokens."""
    mask = batch["response_mask"].to(batch["token_level_rewards"].dtype)
    returns, variance = _returns_and_path_variance(batch, mask)
    lengths = mask.sum(dim=-1).long()
    width = int(lengths.max().item()) if lengths.numel() else 0
    # each row's token positions first, in order (stable sort of "not a token")
    order = torch.sort((mask == 0).to(torch.int8), dim=-1, stable=True).indices[:, :width]
    own = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(-1)).to(mask.dtype)
    compact_returns = returns.gather(-1, order) * own
    compact_variance = variance.gather(-1, order) * own
    members = torch.nonzero(lengths > 0).squeeze(-1)
    baselines = _group_baselines(compact_returns, compact_variance, own, batch["uid"], members)
    advantages = torch.zeros_like(returns).scatter_(-1, order, (compact_returns - baselines) * own)
    return advantages * mask, returns


def _returns_and_path_variance(
    batch: Batch, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns-to-go ``G`` and the cumulative path variance ``W`` ``[B, R]``."""
    rewards = batch["token_level_rewards"] * mask
    returns = rewards.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    per_token = 1 - 2 * batch["old_log_probs"].exp() + batch["sum_pi_squared"]
    if "rollout_is_weights" in batch:
        per_token = per_token * batch["rollout_is_weights"] ** 2
    return returns, (per_token * mask).cumsum(dim=-1)


def _group_baselines(
    returns: torch.Tensor,
    variance: torch.Tensor,
    mask: torch.Tensor,
    uid: Any,
    members: torch.Tensor,
) -> torch.Tensor:
    """``B`` ``[B, width]`` for the rows ``members`` grouped by ``uid``; 0 elsewhere, for a
    group of one, and on a strictly longest trajectory's tail."""
    baselines = torch.zeros_like(returns)
    gid = group_ids(uid, returns.shape[0])[members]
    lengths = mask.sum(dim=-1)
    for group in torch.unique(gid).tolist():
        rows = members[gid == group]
        if len(rows) < 2:
            continue
        weights = variance[rows] * mask[rows]
        step = (returns[rows] * weights).sum(dim=0) / (weights.sum(dim=0) + EPSILON)
        baselines[rows] = step.to(baselines.dtype)
        longest, second = torch.sort(lengths[rows]).values[-2:].tolist()[::-1]
        if longest > second:
            baselines[rows[torch.argmax(lengths[rows])], int(second) :] = 0.0
    return baselines
