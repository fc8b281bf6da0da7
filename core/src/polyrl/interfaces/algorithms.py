"""Call signatures of advantage estimators and policy losses.

Shapes: ``B`` responses in the batch, ``T`` response tokens (right-padded; ``response_mask`` is 1
on real tokens). ``index`` holds one group id per row: rows sampled from the same prompt share it.
``config`` is the ``algorithm`` config node for estimators and the ``actor_rollout_ref.actor``
node for losses, so a plugin reads its own knobs (``config.get("my_knob", default)``) from there
or from ``plugins.<name>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch


class AdvantageEstimatorFn(Protocol):
    """``(advantages[B, T], returns[B, T]) = fn(token_level_rewards=..., response_mask=...,
    index=..., config=..., values=None)``. Both outputs are zero where ``response_mask`` is zero."""

    def __call__(
        self,
        *,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray,
        config: Any,
        values: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class PolicyLossFn(Protocol):
    """``(loss_matrix[B, T], metrics) = fn(old_log_prob=..., log_prob=..., advantages=...,
    response_mask=..., config=...)``.

    Return the per-token loss (to be minimised); the trainer aggregates it with
    ``actor.loss_agg_mode`` so every loss works with every aggregation. ``metrics`` maps names such
    as ``pg_clipfrac`` / ``ppo_kl`` to scalar tensors or floats (reported as ``actor/<name>``).
    """

    def __call__(
        self,
        *,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        config: Any,
    ) -> tuple[torch.Tensor, dict[str, Any]]: ...
