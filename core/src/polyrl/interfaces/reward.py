"""The interface a reward provider implements: it scores decoded responses.

Verifiable rewards (exact match, GSM8K ``#### 42``, math equivalence, reasoning-gym scorers) and a
user's function from a file are built in; a sandbox, a judge model or a reward model can be
published as a plugin.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RewardSample:
    """One response to score. ``index`` is its row in the batch (for error reports)."""

    index: int
    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    prompt_str: str = ""


@dataclass
class RewardResult:
    """A score plus optional named extras (logged as ``reward_extra/<name>/mean``). ``error`` is set
    when scoring failed and ``score`` is the configured failure value."""

    score: float
    extra: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass
class RewardContext:
    """``reward_model`` and ``custom_reward_function`` config nodes, the run's seed, and the
    ``data_source`` values of its training and validation rows (None where the data does not
    tell them), so that a provider starts only what those sources need."""

    reward_model: Any
    custom_reward_function: Any
    seed: int = 0
    data_sources: frozenset[str] | None = None


class RewardProvider(ABC):
    """Scores batches of samples. Runs in the driver process; a provider whose spec declares
    worker roles (``RewardProviderSpec.roles``) reaches them through :attr:`workers`."""

    workers: Any = None

    def __init__(self, ctx: RewardContext) -> None:
        self.ctx = ctx

    def attach_workers(self, workers: Any) -> None:
        """Called by the trainer once the worker groups are up (again after a restart) with the
        driver's handle on them (``workers.call(role, method, batch, dispatch=...)``,
        ``workers.dp_size(role)``), before the first score."""
        self.workers = workers

    @abstractmethod
    def score(self, samples: list[RewardSample]) -> list[RewardResult]:
        """One result per sample, in order."""

    def close(self) -> None:
        """Release worker processes or connections at the end of the run."""
