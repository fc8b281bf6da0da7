"""The default stages of a training step (see :mod:`polyrl.trainer.pipeline`)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from polyrl.batch import Batch
from polyrl.interfaces import RewardProvider, RewardSample, SamplingParams
from polyrl.seeding import derive_seed
from polyrl.trainer.pipeline import StepPipeline, StepState
from polyrl.workers.dispatch import Dispatch
from polyrl.workers.hybrid_worker import MODEL_INPUT_KEYS, TRAIN_KEYS, is_on_policy, needs_reference


@dataclass
class StepServices:
    """What stages use: the config, the worker group, the tokenizer and the algorithm parts."""

    cfg: Any
    workers: Any  # polyrl.workers.worker_group.WorkerGroup
    tokenizer: Any
    reward: RewardProvider
    estimator: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    kl_controller: Any = None


def training_sampling_params(cfg: Any, step: int) -> SamplingParams:
    """Sampling settings of training rollouts; the seed depends on the step only, so a resumed
    run samples exactly what an uninterrupted one would."""
    rollout = cfg.actor_rollout_ref.rollout
    return SamplingParams(
        n=int(rollout.n),
        temperature=float(rollout.temperature),
        top_p=float(rollout.top_p),
        top_k=int(rollout.top_k),
        max_new_tokens=int(cfg.data.max_response_length),
        greedy=not rollout.do_sample,
        seed=derive_seed(int(cfg.trainer.seed), "rollout", step),
    )


def generate(services: StepServices, prompts: Batch, params: SamplingParams) -> Batch:
    """Generate on all ranks; the result holds ``n`` rows per prompt with the prompt's fields."""
    out = services.workers.call(
        "generate",
        prompts.select_keys(("input_ids", "attention_mask")),
        params,
        dispatch=Dispatch.DP_SPLIT,
    )
    return Batch(non_tensors=dict(prompts.non_tensors)).repeat_interleave(params.n).union(out)


def score_responses(services: StepServices, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Decode, score, and place each score on the response's last token."""
    responses, mask = batch["responses"], batch["response_mask"]
    lengths = mask.sum(-1).long()
    texts = services.tokenizer.batch_decode(
        [row[: int(n)] for row, n in zip(responses.tolist(), lengths)], skip_special_tokens=True
    )
    samples = [
        RewardSample(
            index=i,
            data_source=str(batch["data_source"][i]),
            solution_str=texts[i],
            ground_truth=batch["ground_truth"][i],
            extra_info=dict(batch["extra_info"][i] or {}),
            prompt_str=str(batch.get("raw_prompt", [""] * len(batch))[i]),
        )
        for i in range(len(batch))
    ]
    results = services.reward.score(samples)
    scores = torch.zeros(mask.shape, dtype=torch.float32)
    last = (lengths - 1).clamp(min=0)
    scores[torch.arange(len(batch)), last] = torch.tensor([r.score for r in results])
    scores = scores * mask
    metrics: dict[str, float] = {"reward/errors": float(sum(r.error is not None for r in results))}
    extras: dict[str, list[float]] = defaultdict(list)
    for result in results:
        for key, value in result.extra.items():
            extras[key].append(float(value))
    metrics.update({f"reward_extra/{k}/mean": float(np.mean(v)) for k, v in extras.items()})
    return scores, metrics


class GenerateStage:
    name = "gen"

    def __init__(self, services: StepServices) -> None:
        self.services = services

    def run(self, state: StepState) -> None:
        prompts = state.batch
        prompts["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
        params = training_sampling_params(self.services.cfg, state.step)
        state.batch = generate(self.services, prompts, params)


class RewardStage:
    name = "reward"

    def __init__(self, services: StepServices) -> None:
        self.services = services

    def run(self, state: StepState) -> None:
        scores, metrics = score_responses(self.services, state.batch)
        state.batch["token_level_scores"] = scores
        state.metrics.update(metrics)


class OldLogProbStage:
    """Log-probs of the sampled responses under the actor before the update (off-policy updates)."""

    name = "old_log_prob"

    def __init__(self, services: StepServices) -> None:
        self.services = services

    def run(self, state: StepState) -> None:
        out = self.services.workers.call(
            "compute_log_prob",
            state.batch.select_keys(MODEL_INPUT_KEYS),
            dispatch=Dispatch.DP_SPLIT,
        )
        state.batch = state.batch.union(out)
        if "rollout_log_probs" in state.batch:
            state.metrics.update(rollout_mismatch_metrics(state.batch))


def rollout_mismatch_metrics(batch: Batch) -> dict[str, float]:
    """How far the rollout engine's sampling probabilities are from the trainer's for the same
    tokens (verl's ``training/rollout_probs_diff_*``): near zero when weight sync and numerics
    agree; a growing gap means the sampler runs stale or different weights."""
    mask = batch["response_mask"].bool()
    diff = (batch["rollout_log_probs"].exp() - batch["old_log_probs"].exp()).abs()[mask]
    if diff.numel() == 0:
        return {}
    return {
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_max": float(diff.max()),
    }


class RefLogProbStage:
    name = "ref"

    def __init__(self, services: StepServices) -> None:
        self.services = services

    def run(self, state: StepState) -> None:
        out = self.services.workers.call(
            "compute_ref_log_prob",
            state.batch.select_keys(MODEL_INPUT_KEYS),
            dispatch=Dispatch.DP_SPLIT,
        )
        state.batch = state.batch.union(out)


class KLInRewardStage:
    """``rewards = scores - beta * KL(actor || ref)`` per token, beta from the KL controller."""

    name = "kl_in_reward"

    def __init__(self, services: StepServices) -> None:
        self.services = services

    def run(self, state: StepState) -> None:
        from polyrl.algorithms.kl import apply_kl_in_reward

        batch = state.batch
        rewards, metrics = apply_kl_in_reward(
            batch["token_level_scores"],
            batch["old_log_probs"],
            batch["ref_log_prob"],
            batch["response_mask"],
            self.services.kl_controller,
            self.services.cfg.algorithm.kl_penalty,
        )
        batch["token_level_rewards"] = rewards
        state.metrics.update(metrics)


class AdvantageStage:
    name = "adv"

    def __init__(self, services: StepServices) -> None:
        self.services = services

    def run(self, state: StepState) -> None:
        batch = state.batch
        if "token_level_rewards" not in batch:
            batch["token_level_rewards"] = batch["token_level_scores"]
        advantages, returns = self.services.estimator(
            token_level_rewards=batch["token_level_rewards"],
            response_mask=batch["response_mask"],
            index=batch["uid"],
            config=self.services.cfg.algorithm,
            values=batch.get("values"),
        )
        batch["advantages"], batch["returns"] = advantages, returns


class UpdateActorStage:
    name = "update_actor"

    def __init__(self, services: StepServices) -> None:
        self.services = services

    def run(self, state: StepState) -> None:
        keys = [k for k in TRAIN_KEYS if k in state.batch]
        per_rank = self.services.workers.call(
            "update_actor", state.batch.select_keys(keys), dispatch=Dispatch.DP_SPLIT
        )
        for key in per_rank[0]:
            state.metrics[key] = float(np.mean([m[key] for m in per_rank]))


class SyncWeightsStage:
    name = "update_weights"

    def __init__(self, services: StepServices) -> None:
        self.services = services

    def run(self, state: StepState) -> None:
        result = self.services.workers.call("sync_weights", dispatch=Dispatch.RANK_ZERO)
        state.metrics["perf/weight_sync_mb"] = result["bytes"] / 2**20


def build_default_pipeline(services: StepServices) -> StepPipeline:
    """The stages this config needs: the reference only with a KL term, old log-probs only when
    the update is off-policy (several epochs or mini-batches)."""
    cfg = services.cfg
    stages: list[Any] = [GenerateStage(services), RewardStage(services)]
    if not is_on_policy(cfg) or cfg.algorithm.use_kl_in_reward:
        stages.append(OldLogProbStage(services))
    if needs_reference(cfg):
        stages.append(RefLogProbStage(services))
    if cfg.algorithm.use_kl_in_reward:
        stages.append(KLInRewardStage(services))
    stages += [AdvantageStage(services), UpdateActorStage(services), SyncWeightsStage(services)]
    return StepPipeline(stages)
