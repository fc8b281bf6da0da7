"""PF-PPO (verl's ``algorithm.use_pf_ppo``, policy filtration): after the advantages, the batch is
resampled with replacement, each response drawn with a weight of its score, so that the critic
and the actor learn more from the responses whose reward is most telling. Same size, same
formulas as verl's ``compute_pf_ppo_reweight_data``:

- ``pow``: weight ``|score| ** weight_pow``;
- ``max_min``: 1 for the responses with the batch's highest or lowest score, 0 otherwise;
- ``max_random``: 0.4 for the highest-scored responses, 0.1 for the others;

each weight plus 1e-8 (so every row keeps a chance), ``score`` being the sum of the row's
``token_level_scores`` (the reward before any KL penalty). The draw is seeded from
``trainer.seed`` and the step, so a resumed run draws the same rows.
"""

from __future__ import annotations

from typing import Any

import torch

from polyrl.api import Stage, StepContext, StepState, derive_seed
from polyrl_algo_ppo.settings import REWEIGHT_METHODS


def pf_ppo_weights(scores: torch.Tensor, method: str, weight_pow: float) -> torch.Tensor:
    """verl's sampling weights of the rows with sequence scores ``scores`` ``[B]``."""
    if method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif method == "max_min":
        extreme = (scores == scores.max()) | (scores == scores.min())
        weights = extreme.to(scores.dtype)
    elif method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(
            f"algorithm.pf_ppo.reweight_method={method!r}: use one of {REWEIGHT_METHODS}"
        )
    return (weights + 1e-8).clamp(min=1e-8)


def pf_ppo_rows(scores: torch.Tensor, method: str, weight_pow: float, seed: int) -> torch.Tensor:
    """The rows of the resampled batch: ``len(scores)`` draws with replacement."""
    weights = pf_ppo_weights(scores.float(), method, weight_pow)
    generator = torch.Generator().manual_seed(seed)
    return torch.multinomial(weights.cpu(), len(scores), replacement=True, generator=generator)


class PfPpoStage(Stage):
    """The batch resampled by its scores (PF-PPO), between the advantages and the updates."""

    name = "pf_ppo"
    requires = ("token_level_scores", "advantages")

    def __init__(self, cfg: Any) -> None:
        self.method = str(cfg.algorithm.pf_ppo.reweight_method)
        self.weight_pow = float(cfg.algorithm.pf_ppo.weight_pow)
        self.seed = int(cfg.trainer.seed)

    def run(self, state: StepState, ctx: StepContext) -> None:
        scores = state.batch["token_level_scores"].sum(-1)
        rows = pf_ppo_rows(
            scores, self.method, self.weight_pow, derive_seed(self.seed, "pf_ppo", state.step)
        )
        state.batch = state.batch.select_rows(rows)
        state.metrics["pf_ppo/distinct_rows"] = float(rows.unique().numel())
