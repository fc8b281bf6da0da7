"""DAPO (Yu et al., 2025) as a step: GRPO's step with dynamic sampling
(``algorithm.filter_groups.*``, :mod:`polyrl_algo_grpo.dynamic_sampling`) and the soft overlong
punishment (``reward_model.overlong_buffer.*``, :mod:`polyrl_algo_grpo.overlong`); clip-higher
and the token-mean loss are config defaults of the ``dapo`` algorithm (see its plugin entry)."""

from __future__ import annotations

from typing import Any

from polyrl.api import StepPipeline, policy_gradient_pipeline
from polyrl_algo_grpo.dynamic_sampling import with_dynamic_sampling
from polyrl_algo_grpo.overlong import OverlongPenaltyStage


def overlong_shaped_pipeline(cfg: Any) -> StepPipeline:
    """core's critic-free step with ``overlong_penalty`` after ``reward`` when
    ``reward_model.overlong_buffer.enable``: the step of the GRPO family, since verl applies the
    punishment through its DAPO reward manager (``reward_manager=dapo``) whatever the estimator."""
    step = policy_gradient_pipeline(cfg)
    if cfg.reward_model.overlong_buffer.enable:
        step.insert_after("reward", OverlongPenaltyStage(cfg))
    return step


def dapo_pipeline(cfg: Any) -> StepPipeline:
    """``gen -> reward -> [overlong_penalty]`` (per generation round, inside
    ``dynamic_sampling`` when filtering is on) ``-> old_log_prob -> ... -> update_weights``."""
    step = overlong_shaped_pipeline(cfg)
    if cfg.algorithm.filter_groups.enable:
        with_dynamic_sampling(step, cfg)
    return step
