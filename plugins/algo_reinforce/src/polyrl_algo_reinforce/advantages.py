"""REINFORCE-family advantages: no critic, and (except REINFORCE++-baseline) no groups.

- **ReMax** (Li et al., 2023): the return-to-go of each token minus a per-prompt baseline, the
  reward of the policy's *greedy* response to the same prompt (the ``gen_max`` stage of
  :mod:`polyrl_algo_reinforce.remax` provides it as ``reward_baselines``). One greedy decode per
  prompt replaces a critic: cheap, and its variance reduction needs no second model.
- **REINFORCE++** (Hu, 2025): the discounted return-to-go (``algorithm.gamma``) of each token,
  whitened over every response token of the batch. The batch-wide normalisation is what makes it
  stable without groups or a critic.
- **REINFORCE++-baseline**: each response's score minus its group's mean (the samples of one
  prompt), then whitened over the batch like REINFORCE++: GRPO's baseline without GRPO's
  per-group std, which over-weights prompts that are almost always solved or failed.

The formulas are verl 0.9.1's (``verl/trainer/ppo/core_algos.py``) with two deliberate
differences, both invisible on real batches: padding positions are treated as reward 0 (a NaN or
junk value in padding cannot leak in), and, as everywhere in polyrl-algo-grpo, a group of one
sample is neutral in REINFORCE++-baseline (its centred score is 0; verl keeps the raw score).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from polyrl.api import masked_whiten
from polyrl_algo_grpo.grouping import group_stats

if TYPE_CHECKING:
    from polyrl.api import Batch


def _rewards_and_mask(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_level_rewards`` with padding set to 0, and the response mask in their dtype."""
    rewards, mask = batch["token_level_rewards"], batch["response_mask"]
    if rewards.dim() != 2 or rewards.shape != mask.shape:
        raise ValueError(
            "token_level_rewards and response_mask must both be [B, T], got "
            f"{tuple(rewards.shape)} and {tuple(mask.shape)}"
        )
    mask = mask.to(rewards.dtype)
    return torch.where(mask != 0, rewards, torch.zeros_like(rewards)), mask


def _per_row(values: Any, rows: int, name: str) -> torch.Tensor:
    """A batch column of one number per row (a tensor, or a numpy array of floats) as float64."""
    column = torch.as_tensor(np.asarray(values, dtype=np.float64).reshape(-1))
    if column.shape[0] != rows:
        raise ValueError(f"{name} has {column.shape[0]} values but the batch has {rows} rows")
    return column


@torch.no_grad()
def remax_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: ``returns[t] = sum_{s >= t} r_s`` and ``advantages = returns - baseline`` on every
    response token, the baseline being ``batch["reward_baselines"]`` (the greedy response's
    reward, one number per row). No whitening: the baseline already centres the returns."""
    rewards, mask = _rewards_and_mask(batch)
    baselines = _per_row(batch["reward_baselines"], rewards.shape[0], "reward_baselines")
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask
    advantages = returns - baselines.to(rewards.dtype).unsqueeze(-1) * mask
    return advantages, returns


@torch.no_grad()
def reinforce_plus_plus_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: ``G_t = r_t + gamma * G_{t+1}``, restarted wherever the mask is 0 (after the
    response ends), then ``advantages = whiten(G)`` over all response tokens of the batch
    (unbiased std, no mean added back). ``returns`` are the un-whitened ``G``."""
    rewards, mask = _rewards_and_mask(batch)
    gamma = float(config.gamma)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns * mask


@torch.no_grad()
def reinforce_plus_plus_baseline_advantage(
    batch: Batch, config: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: ``s_i - mean_g`` (the response's score minus its group's mean,
    groups given by ``batch["uid"]``), broadcast over the response's tokens and whitened over all
    response tokens of the batch. ``returns`` equal the advantages, as in verl."""
    rewards, mask = _rewards_and_mask(batch)
    scores = rewards.sum(-1).to(torch.float64)
    stats = group_stats(scores, batch["uid"])
    centred = torch.where(stats.size > 1, scores - stats.mean, 0.0).to(rewards.dtype)
    advantages = masked_whiten(centred.unsqueeze(-1) * mask, mask) * mask
    return advantages, advantages.clone()
