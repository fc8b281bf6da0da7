"""DAPO's dynamic sampling: generate in rounds of ``data.gen_batch_size`` prompts, drop the
groups whose ``algorithm.filter_groups.metric`` is the same for every sample, and keep going
until ``data.train_batch_size`` groups are kept (verl's ``recipe/dapo`` loop, as one stage).

The stage takes the place of the stages that turn prompts into a scored rollout (``gen``, then
``reward`` and any reward shaping before ``old_log_prob``) and runs them once per round: it
generates itself (so each round gets a sampling seed of its own; the first round's is the
standard step's) and runs the scoring stages as they are. Everything after it (old log-probs,
reference, KL in the reward, advantages, update) sees only the kept groups.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from polyrl.api import (
    Batch,
    PolyrlError,
    RewardProvider,
    RewardResult,
    RewardSample,
    Stage,
    StepContext,
    StepPipeline,
    StepState,
    derive_seed,
    generate,
    training_sampling_params,
)
from polyrl_algo_grpo.group_filter import first_groups, groups_with_spread, metric_values
from polyrl_algo_grpo.rollout_rounds import PromptStream, concat_rounds


class DynamicSamplingError(PolyrlError):
    """Too few groups with a reward spread within ``max_num_gen_batches`` generation rounds."""


class RecordingReward(RewardProvider):
    """The run's reward provider, keeping every result it returns: the filter reads per-sample
    extras (``acc``) that the reward stage reduces to means before they reach the batch."""

    def __init__(self, inner: RewardProvider) -> None:
        super().__init__(inner.ctx)
        self.inner = inner
        self.results: list[RewardResult] = []

    def score(self, samples: list[RewardSample]) -> list[RewardResult]:
        results = self.inner.score(samples)
        self.results.extend(results)
        return results


@dataclass
class Tally:
    """What the rounds of one step saw; ``sampled``: each round's scores before filtering (the
    ``token_level_scores`` of its ``sampled_rows`` rows)."""

    rounds: int = 0
    kept: int = 0
    dropped: int = 0
    sampled_rows: int = 0
    sampled: list[Batch] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {
            "train/num_gen_batches": float(self.rounds),  # verl's name
            "train/num_groups_kept": float(self.kept),
            "train/num_groups_dropped": float(self.dropped),
        }


class DynamicSamplingStage(Stage):
    """Generation rounds until ``data.train_batch_size`` groups with a spread are kept, trimmed
    to exactly that many (whole groups, in the order they were generated).

    With ``algorithm.filter_groups.max_num_gen_batches`` rounds done and too few groups kept, the
    step stops with one line naming the keys to change, or, with
    ``algorithm.filter_groups.train_partial_batch=true``, trains on the groups kept so far: as
    many as split evenly over the actor's data-parallel ranks (the update needs an even split).

    Metrics: ``train/num_gen_batches`` (rounds), ``train/num_groups_kept`` and
    ``train/num_groups_dropped`` (over all rounds, before trimming); the scoring stages' own
    metrics averaged over the rounds; ``timing_s/gen`` and each scoring stage's timing summed.
    When rows were dropped, ``critic/score/*`` are those of every response sampled (all rounds,
    scored by the whole scoring chain, before filtering) and the trainer reports the kept rows'
    as ``critic/kept_score/*`` (:meth:`StepState.record_sampled_scores`): the kept groups all
    have a spread, so their mean says little about how well the policy does.
    """

    name = "dynamic_sampling"

    def __init__(self, cfg: Any, gen: Stage, scoring: Sequence[Stage]) -> None:
        """``gen``: the step's generation stage, whose contract (keys, roles) this stage takes
        over while generating itself; ``scoring``: the stages run on every round's rollout."""
        self.scoring = StepPipeline(scoring)
        inner = [gen, *scoring]
        requires: dict[str, None] = {}
        provided: dict[str, None] = {}
        for stage in inner:  # what the inner chain needs from outside, and what it leaves
            requires.update(dict.fromkeys(k for k in stage.requires if k not in provided))
            provided.update(dict.fromkeys(stage.provides))
        self.requires, self.provides = tuple(requires), tuple(provided)
        self.roles = tuple(dict.fromkeys(r for s in inner for r in s.roles))
        settings = cfg.algorithm.filter_groups
        self.metric = str(settings.metric)
        self.max_rounds = int(settings.max_num_gen_batches)
        self.train_partial_batch = bool(settings.train_partial_batch)
        self.groups_wanted = int(cfg.data.train_batch_size)
        self.round_prompts = int(cfg.data.gen_batch_size)

    def run(self, state: StepState, ctx: StepContext) -> None:
        pad_id = int(ctx.tokenizer.pad_token_id)
        prompts = PromptStream(state.batch, ctx.next_prompts, pad_id)
        tally, kept_parts = Tally(), []
        round_metrics: dict[str, list[float]] = defaultdict(list)
        while tally.kept < self.groups_wanted:
            if 0 < self.max_rounds <= tally.rounds:
                self._out_of_rounds(tally)
                break
            tally.rounds += 1
            scored = self._sample_round(state, ctx, prompts.take(self.round_prompts), tally)
            for key, value in scored.metrics.items():
                round_metrics[key].append(value)
            kept_parts.append(scored.batch)
        batch = concat_rounds(kept_parts, pad_id)
        dp_size = ctx.workers.dp_size("actor")
        rows = first_groups(batch["uid"], self.groups_wanted, dp_size) if len(batch) else []
        if not len(rows):
            raise DynamicSamplingError(
                f"dynamic sampling kept {tally.kept} group(s) in {tally.rounds} generation "
                f"batches, too few to split over {dp_size} data-parallel ranks; raise "
                f"algorithm.filter_groups.max_num_gen_batches"
            )
        state.batch = batch.select_rows(rows)
        state.metrics.update({k: float(np.mean(v)) for k, v in round_metrics.items()})
        state.metrics.update(tally.metrics())
        if len(state.batch) < tally.sampled_rows:
            state.record_sampled_scores(*tally.sampled)

    def state_dict(self) -> dict[str, Any]:
        """The state of the scoring stages it runs (a reward stage's failure history), so that
        checkpoints hold it as they would without dynamic sampling."""
        return self.scoring.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scoring.load_state_dict(state)

    def _sample_round(
        self, state: StepState, ctx: StepContext, prompts: Batch, tally: Tally
    ) -> StepState:
        """One round: generate, score with the scoring stages, keep the groups with a spread.
        Returns the round's state (its batch: the kept rows) and adds its timings to ``state``."""
        prompts["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
        params = training_sampling_params(ctx.cfg, state.step)
        if tally.rounds > 1:
            params = replace(params, seed=derive_seed(int(params.seed), "round", tally.rounds))
        with state.timed("gen"):
            generated = generate(ctx, prompts, params)
        recorder = RecordingReward(ctx.reward)
        scored = StepState(step=state.step, batch=generated)
        self.scoring.run(scored, replace(ctx, reward=recorder))
        for key, seconds in scored.timing.items():
            state.timing[key] = state.timing.get(key, 0.0) + seconds
        tally.sampled_rows += len(scored.batch)
        tally.sampled.append(scored.batch.select_keys(("token_level_scores",)))
        values = metric_values(scored.batch, recorder.results, self.metric)
        verdict = groups_with_spread(scored.batch["uid"], values)
        tally.kept += verdict.kept
        tally.dropped += verdict.dropped
        scored.batch = scored.batch.select_rows(np.flatnonzero(verdict.keep_rows))
        return scored

    def _out_of_rounds(self, tally: Tally) -> None:
        """At the round limit: stop the run, unless a partial batch is allowed."""
        if self.train_partial_batch:
            return
        raise DynamicSamplingError(
            f"dynamic sampling kept {tally.kept} of the {self.groups_wanted} groups "
            f"data.train_batch_size asks for in algorithm.filter_groups.max_num_gen_batches="
            f"{self.max_rounds} generation batches ({tally.dropped} groups dropped: all their "
            f"samples had the same {self.metric}); the prompts may be too easy or too hard for "
            f"the model. Raise algorithm.filter_groups.max_num_gen_batches (0: no limit), or set "
            f"algorithm.filter_groups.train_partial_batch=true to train on the groups kept"
        )


def with_dynamic_sampling(step: StepPipeline, cfg: Any) -> StepPipeline:
    """``step`` with its sampling stages (``gen`` up to, not including, ``old_log_prob``)
    replaced by one :class:`DynamicSamplingStage` that runs them per round."""
    names = step.names()
    sampling = step.stages[names.index("gen") : names.index("old_log_prob")]
    for stage in sampling:
        step.remove(stage.name)
    step.insert_before("old_log_prob", DynamicSamplingStage(cfg, sampling[0], sampling[1:]))
    return step
