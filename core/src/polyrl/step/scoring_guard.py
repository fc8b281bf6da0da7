"""Stop a run whose rewards fail to score, instead of "training" on failure scores.

A reward function that raises, returns NaN, or has no scorer for the data's ``data_source`` gives
every sample ``reward_model.failure_score``: all advantages are zero, nothing is learned, and the
run would still finish and exit 0. The guard keeps the share of failed samples over the last
``reward_model.failure_window_steps`` steps and raises once it reaches
``reward_model.max_failure_rate``, naming the most common error. A run shorter than the window
is judged on the steps it has when it ends (:meth:`ScoringFailureGuard.finish`): however short, a
run whose rewards all failed does not finish with exit status 0.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

from polyrl.errors import RewardError
from polyrl.interfaces import RewardResult


class ScoringFailureGuard:
    """Failure counts of recent steps, and the check."""

    def __init__(self, max_failure_rate: float, window_steps: int) -> None:
        self.max_failure_rate = float(max_failure_rate)
        self.history: deque[tuple[int, int, int, dict[str, int]]] = deque(maxlen=window_steps)

    def record(self, step: int, results: Sequence[RewardResult]) -> None:
        """Add ``step``'s results; raise :class:`RewardError` when the window is full and its
        failure share has reached the limit."""
        errors = Counter(r.error for r in results if r.error is not None)
        self.history.append((step, sum(errors.values()), len(results), dict(errors)))
        if len(self.history) >= (self.history.maxlen or 1):
            self._check()

    def finish(self) -> None:
        """At the end of the run: the same check over a window the run was too short to fill
        (a full one was checked at its last step)."""
        if self.history and len(self.history) < (self.history.maxlen or 1):
            self._check()

    def _check(self) -> None:
        failed = sum(h[1] for h in self.history)
        total = sum(h[2] for h in self.history)
        if not total or failed / total < self.max_failure_rate:
            return
        merged: Counter[str] = Counter()
        for h in self.history:
            merged.update(h[3])
        error, count = merged.most_common(1)[0]
        raise RewardError(
            f"reward scoring failed for {failed} of {total} samples over steps "
            f"{self.history[0][0]}-{self.history[-1][0]} (reward_model.max_failure_rate="
            f"{self.max_failure_rate:g}), so nothing can be learned; most common error "
            f"({count}x): {error}. Fix the scorer (the data_source's scorer or "
            f"custom_reward_function.path) or raise reward_model.max_failure_rate"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.clear()
        for step, failed, total, errors in state["history"]:
            self.history.append((int(step), int(failed), int(total), dict(errors)))
