"""The standard policy-gradient step, shared by the critic-free algorithms (GRPO, Dr.GRPO,
RLOO, and any estimator plugin without an algorithm of its own)::

    gen -> reward -> [reward_model] -> old_log_prob -> [ref] -> [kl_in_reward] -> adv
        -> update_actor -> update_weights

The reward model's stage is present when ``reward_model.enable`` is true. The reference
stage is present only when a KL term reads it (``actor.use_kl_loss`` or
``algorithm.use_kl_in_reward``); the KL penalty in the reward only with
``algorithm.use_kl_in_reward``. With ``actor_rollout_ref.rollout.multi_turn.enable`` the ``gen``
and ``reward`` stages are the multi-turn ones (:mod:`polyrl.step.multi_turn`: episodes with an
environment, under the same names), so every algorithm built on this step runs on trajectories.
Algorithms that need more start from this pipeline and edit it.
"""

from __future__ import annotations

from typing import Any

from polyrl.step.multi_turn import EpisodeGenerateStage, EpisodeRewardStage
from polyrl.step.pipeline import StepPipeline
from polyrl.step.reward_model import RewardModelStage
from polyrl.step.stages import (
    AdvantageStage,
    GenerateStage,
    KLInRewardStage,
    OldLogProbStage,
    RefLogProbStage,
    RewardStage,
    Stage,
    SyncWeightsStage,
    UpdateActorStage,
)


def policy_gradient_pipeline(cfg: Any) -> StepPipeline:
    """The step above for the composed config ``cfg``."""
    kl_in_reward = bool(cfg.algorithm.use_kl_in_reward)
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        stages: list[Stage] = [EpisodeGenerateStage(cfg), EpisodeRewardStage()]
    else:
        stages = [GenerateStage(cfg), RewardStage(cfg)]
    if cfg.reward_model.enable:
        stages.append(RewardModelStage(cfg))
    squares = bool(cfg.actor_rollout_ref.actor.calculate_sum_pi_squared)
    stages.append(OldLogProbStage(needed_before_update=kl_in_reward, sum_pi_squared=squares))
    if kl_in_reward or cfg.actor_rollout_ref.actor.use_kl_loss:
        stages.append(RefLogProbStage())
    if kl_in_reward:
        stages.append(KLInRewardStage(cfg))
    stages += [AdvantageStage(cfg), UpdateActorStage(cfg), SyncWeightsStage()]
    return StepPipeline(stages)
