"""Per-step metrics computed on the driver from the step's batch, under verl's names.

``critic/score/*`` describe the responses sampled for the step. When a stage filtered rows
(DAPO's dynamic sampling drops the groups without a reward spread), it recorded them on the
scored batch before filtering (:meth:`polyrl.step.StepState.record_sampled_scores`), and the
scores of the rows trained on are ``critic/kept_score/*``; without a filter the step's final
batch is the sampled one and there is no ``critic/kept_score``. The other batch metrics
(rewards, advantages, lengths) are always those of the final batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polyrl.batch import Batch


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


# verl's metric name of each per-response sum and of each per-token quantity, where the step's
# batch has the key (an algorithm's pipeline decides which it has).
SCORE = "critic/score"
KEPT_SCORE = "critic/kept_score"
RESPONSE_SUMS = {"token_level_scores": SCORE, "token_level_rewards": "critic/rewards"}
TOKEN_VALUES = {"advantages": "critic/advantages", "returns": "critic/returns"}


def sampled_score_metrics(sampled: Sequence[Batch]) -> dict[str, float]:
    """``critic/score/*`` over the rows of every batch in ``sampled`` that has
    ``token_level_scores`` (empty when none has)."""
    sums = [b["token_level_scores"].sum(-1) for b in sampled if "token_level_scores" in b]
    return _stats(SCORE, torch.cat(sums)) if sums else {}


def data_metrics(batch: Batch, *, filtered: bool = False) -> dict[str, float]:
    """Scores, rewards, advantages, returns and lengths of the step's responses. ``filtered``:
    a stage recorded the sampled responses' ``critic/score/*`` before dropping rows, so this
    batch's scores are ``critic/kept_score/*``."""
    mask = batch["response_mask"].bool()
    response_length = mask.sum(-1).float()
    prompt_length = batch["attention_mask"].sum(-1).float() - response_length
    max_len = mask.shape[-1]
    metrics: dict[str, float] = {}
    for key, name in RESPONSE_SUMS.items():
        if key in batch:
            name = KEPT_SCORE if filtered and name == SCORE else name
            metrics.update(_stats(name, batch[key].sum(-1)))
    for key, name in TOKEN_VALUES.items():
        if key in batch:
            metrics.update(_stats(name, batch[key][mask]))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = float((response_length >= max_len).float().mean())
    metrics.update(_stats("prompt_length", prompt_length))
    return metrics


def step_batch_metrics(batch: Batch, stage_metrics: dict[str, float]) -> dict[str, float]:
    """:func:`data_metrics` of the step's final batch, the scores under ``critic/kept_score``
    when the stages' metrics already hold the sampled responses' ``critic/score``."""
    return data_metrics(batch, filtered=f"{SCORE}/mean" in stage_metrics)


def timing_and_throughput(
    timing: dict[str, float], batch: Batch, world_size: int
) -> dict[str, float]:
    """``timing_s/*`` and ``perf/throughput`` (prompt+response tokens per second per device)."""
    metrics = {f"timing_s/{name}": seconds for name, seconds in timing.items()}
    tokens = float(batch["attention_mask"].sum())
    step_time = timing.get("step", sum(timing.values()))
    metrics["perf/total_num_tokens"] = tokens
    metrics["perf/time_per_step"] = step_time
    metrics["perf/throughput"] = tokens / max(step_time, 1e-9) / world_size
    return metrics
