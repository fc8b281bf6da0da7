"""ReMax's extra stage: one greedy response per prompt, scored with the run's reward, as the
baseline of that prompt's sampled responses.

The stage runs on the prompt batch, before the standard ``gen`` stage: the prompts are still
plain there (``gen`` turns ``input_ids`` into prompt + response), and the baseline, stored as a
per-prompt column, travels with each prompt's ``n`` samples when ``gen`` repeats the prompt's
fields. Both generations use the same (pre-update) weights, so their order does not matter.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from polyrl.api import (
    Stage,
    StepContext,
    StepPipeline,
    StepState,
    generate,
    policy_gradient_pipeline,
    score_responses,
    training_sampling_params,
)

BASELINE_KEY = "reward_baselines"  # verl's name for ReMax's baseline


class GreedyBaselineStage(Stage):
    """Greedy decoding (n=1) of every prompt through the rollout role; the summed token scores
    of each greedy response become ``reward_baselines`` (verl's timing name ``gen_max``)."""

    name = "gen_max"
    requires = ("input_ids", "attention_mask", "data_source", "ground_truth", "extra_info")
    provides = (BASELINE_KEY,)
    roles = ("rollout",)

    def run(self, state: StepState, ctx: StepContext) -> None:
        params = replace(training_sampling_params(ctx.cfg, state.step), n=1, greedy=True)
        greedy = generate(ctx, state.batch, params)
        scores, _ = score_responses(ctx, greedy)
        baselines = scores.sum(-1)
        state.batch[BASELINE_KEY] = baselines.double().numpy()
        state.metrics["remax/baseline_score/mean"] = float(baselines.mean())


def remax_pipeline(cfg: Any) -> StepPipeline:
    """The standard policy-gradient step with the greedy baseline generated first."""
    step = policy_gradient_pipeline(cfg)
    step.insert_before("gen", GreedyBaselineStage())
    return step
