"""GDPO (arXiv 2601.05242, "Group reward-Decoupled Normalization Policy Optimization"): with
several rewards, normalise each within its group BEFORE adding them.

GRPO on the sum of a format reward and an accuracy reward lets the one with the larger spread
drown the other. GDPO gives each reward dimension ``k`` (``algorithm.gdpo_reward_keys``: values
the reward returns per sample beside its score) its own group-normalised advantage, adds them
with ``algorithm.gdpo_reward_weights``, and whitens the sum over the batch's response tokens:

    A_k = (r_k - mean_g(r_k)) / (std_g(r_k) + 1e-6)     (no std: norm_adv_by_std_in_grpo=false)
    A   = whiten(sum_k w_k A_k)

The rewards' per-sample values do not reach the batch in the standard step (the reward stage
logs their means), so the ``gdpo`` algorithm's step wraps the reward stage: it records the
reward's results and writes the dimensions as ``reward_components`` ``[rows, K]``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import (
    RewardError,
    Stage,
    StepContext,
    StepPipeline,
    StepState,
    masked_whiten,
    names,
    policy_gradient_pipeline,
)
from polyrl_algo_grpo.advantages import grpo_advantage
from polyrl_algo_grpo.dynamic_sampling import RecordingReward

if TYPE_CHECKING:
    from polyrl.api import Batch

REWARD_COMPONENTS = "reward_components"
KEYS = "algorithm.gdpo_reward_keys"
WEIGHTS = "algorithm.gdpo_reward_weights"


def reward_keys(algorithm: Any) -> list[str]:
    return [str(key) for key in (algorithm.gdpo_reward_keys or [])]


def check_gdpo_config(cfg: Any) -> list[str]:
    """The reward dimensions are named, and the weights (when given) match them."""
    keys, weights = cfg.algorithm.gdpo_reward_keys, cfg.algorithm.gdpo_reward_weights
    if not keys or isinstance(keys, str) or not all(str(k).strip() for k in keys):
        return [
            f"{KEYS}={keys!r}: adv_estimator=gdpo needs the list of per-sample values the reward "
            f"returns beside its score, e.g. {KEYS}=[format_reward,accuracy_reward]"
        ]
    if weights is not None and (isinstance(weights, str) or len(weights) != len(keys)):
        return [f"{WEIGHTS}={weights!r} must be null or one number per key of {KEYS} ({len(keys)})"]
    return []


class RewardComponentsStage(Stage):
    """The reward stage, also writing ``reward_components[:, k]``: each sample's value of
    ``gdpo_reward_keys[k]`` as its reward returned it."""

    def __init__(self, stage: Stage, keys: list[str]) -> None:
        self.stage, self.keys = stage, keys
        self.name, self.roles = stage.name, stage.roles
        self.requires = stage.requires
        self.provides = (*stage.provides, REWARD_COMPONENTS)

    def bind(self, plan: Any) -> None:
        self.stage.bind(plan)
        self.requires, self.provides = (
            self.stage.requires,
            (*self.stage.provides, REWARD_COMPONENTS),
        )

    def link(self, later: Any) -> None:
        self.stage.link(later)

    def run(self, state: StepState, ctx: StepContext) -> None:
        recorder = RecordingReward(ctx.reward)
        self.stage.run(state, replace(ctx, reward=recorder))
        results = recorder.results
        for key in self.keys:
            missing = [r for r in results if key not in r.extra]
            if missing:
                raise RewardError(
                    f"{KEYS} names {key!r}, but the reward returned no {key!r} for "
                    f"{len(missing)} of {len(results)} samples (it returns "
                    f"{sorted(missing[0].extra) or 'no extras'}); return it from compute_score"
                )
        values = [[float(r.extra[key]) for key in self.keys] for r in results]
        state.batch[REWARD_COMPONENTS] = torch.tensor(values, dtype=torch.float32)

    def state_dict(self) -> dict[str, Any]:
        return self.stage.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stage.load_state_dict(state)


def gdpo_pipeline(cfg: Any) -> StepPipeline:
    """The standard policy-gradient step with the reward stage recording the dimensions."""
    step = policy_gradient_pipeline(cfg)
    step.replace(
        names.STAGE_REWARD,
        RewardComponentsStage(step[names.STAGE_REWARD], reward_keys(cfg.algorithm)),
    )
    return step


@torch.no_grad()
def gdpo_advantage(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO's advantages (module doc) from ``reward_components``; ``returns`` equal them.

    Each dimension's value sits on the response's last token, as a score does, and goes through
    GRPO's estimator (same epsilon, same singleton rule); the weighted sum is whitened over the
    response tokens of the batch (a longer response counts once per token, as in verl)."""
    components = batch[REWARD_COMPONENTS]
    mask = batch["response_mask"]
    if components.dim() != 2 or components.shape[0] != mask.shape[0]:
        raise ValueError(
            f"{REWARD_COMPONENTS} must be [rows, K] for a batch of {mask.shape[0]} rows, got "
            f"{tuple(components.shape)}"
        )
    weights = config.gdpo_reward_weights
    weights = [1.0] * components.shape[1] if weights is None else [float(w) for w in weights]
    last = (mask.sum(dim=-1).long() - 1).clamp(min=0)
    total = torch.zeros(mask.shape, dtype=torch.float32)
    for k, weight in enumerate(weights):
        rewards = torch.zeros(mask.shape, dtype=torch.float32)
        rewards[torch.arange(mask.shape[0]), last] = components[:, k].float()
        dimension = {
            "token_level_rewards": rewards * mask,
            "response_mask": mask,
            "uid": batch["uid"],
        }
        advantage, _ = grpo_advantage(dimension, config)
        total = total + weight * advantage
    advantages = masked_whiten(total, mask) * mask
    return advantages, advantages.clone()
