"""The optimizer every polyrl engine builds (torch's AdamW) and its learning-rate schedule:
linear warm-up, then constant or cosine decay to ``min_lr_ratio``.

One scheduler step per optimizer step. During warm-up the factor is ``(k + 1) / warmup`` for
optimizer step ``k`` (0-based), so the first update already moves the weights (the Hugging Face
convention ``k / warmup`` spends the first step at lr 0) and step ``warmup - 1`` reaches the full
rate. Cosine decays over the steps after warm-up and stays at ``min_lr_ratio`` past the end.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import torch

from polyrl_engine_kit.config import OptimSettings


def lr_factor(step: int, settings: OptimSettings) -> float:
    """The multiplier of the base learning rate at optimizer step ``step`` (0-based)."""
    warmup = settings.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if settings.warmup_style == "constant":
        return 1.0
    decay_steps = max(1, settings.total_steps - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * cosine


def build_scheduler(
    optimizer: torch.optim.Optimizer, settings: OptimSettings
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`lr_factor` (its state dict is the step counter)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, settings))


def build_adamw(
    params: Iterable[torch.nn.Parameter], settings: OptimSettings, fused: bool = False
) -> torch.optim.AdamW:
    """torch's AdamW with the role's ``optim`` settings (lr, betas, weight decay). ``fused``:
    one kernel for the whole update (for parameters on CUDA), instead of a dozen per tensor."""
    return torch.optim.AdamW(
        params,
        lr=settings.lr,
        betas=settings.betas,
        weight_decay=settings.weight_decay,
        fused=fused or None,
    )


def advance_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler, skipped: bool) -> None:
    """One scheduler step per optimizer step, applied or ``skipped`` (a non-finite grad norm):
    torch warns when the schedule moves before any ``optimizer.step()``, which a skip makes
    legitimate, so that warning is silenced then."""
    with warnings.catch_warnings():
        if skipped:
            warnings.simplefilter("ignore", UserWarning)
        scheduler.step()
