"""``TrainingEngine.compute_log_prob`` and ``compute_log_prob_and_sum_pi_squared`` for an engine
built on the kit: both are one no-grad scoring of the batch (:meth:`LogProbMethods._scores`,
the engine's own loop over its micro-batches) that returns what was asked for, so the two
public methods cannot drift apart between engines."""

from __future__ import annotations

import torch

from polyrl.api import Batch
from polyrl_engine_kit.logprob import TokenScores


class LogProbMethods:
    """Mixed into an engine (before ``TrainingEngine``) that implements :meth:`_scores`."""

    def _scores(
        self, batch: Batch, temperature: float, calculate_entropy: bool, sum_pi_squared: bool
    ) -> TokenScores:
        """float32 ``[B, R]`` scores of the whole batch on the host, without grad; entropy and
        ``sum_pi_squared`` None unless asked for."""
        raise NotImplementedError

    def compute_log_prob(
        self, batch: Batch, *, temperature: float = 1.0, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        log_prob, entropy, _ = self._scores(batch, temperature, calculate_entropy, False)
        return log_prob, entropy

    def compute_log_prob_and_sum_pi_squared(
        self, batch: Batch, *, temperature: float = 1.0, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        log_prob, entropy, squares = self._scores(batch, temperature, calculate_entropy, True)
        assert squares is not None
        return log_prob, entropy, squares
