"""Per-step metrics computed on the driver from the step's batch, under verl's names."""

from __future__ import annotations

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
RESPONSE_SUMS = {"token_level_scores": "critic/score", "token_level_rewards": "critic/rewards"}
TOKEN_VALUES = {"advantages": "critic/advantages", "returns": "critic/returns"}


def data_metrics(batch: Batch) -> dict[str, float]:
    """Scores, rewards, advantages, returns and lengths of the step's responses."""
    mask = batch["response_mask"].bool()
    response_length = mask.sum(-1).float()
    prompt_length = batch["attention_mask"].sum(-1).float() - response_length
    max_len = mask.shape[-1]
    metrics: dict[str, float] = {}
    for key, name in RESPONSE_SUMS.items():
        if key in batch:
            metrics.update(_stats(name, batch[key].sum(-1)))
    for key, name in TOKEN_VALUES.items():
        if key in batch:
            metrics.update(_stats(name, batch[key][mask]))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = float((response_length >= max_len).float().mean())
    metrics.update(_stats("prompt_length", prompt_length))
    return metrics


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
