"""Call signatures of advantage estimators and policy losses.

Both receive the :class:`~polyrl.batch.Batch` itself rather than a fixed list of tensors, so an
estimator or a loss that needs more than the usual keys (``values`` for GAE, ``rollout_log_probs``
for truncated importance sampling) reads them from the batch without a signature change; the
keys it reads are declared in its spec's ``requires`` so the step can check, before the run, that
an earlier stage provides each.

Shapes: ``B`` responses in the batch, ``T`` response tokens (right-padded; ``response_mask`` is 1
on real tokens). ``batch["uid"]`` holds one group id per row: rows sampled from the same prompt
share it.

``config`` is the ``algorithm`` config node for estimators and the ``actor_rollout_ref.actor``
node for losses: an OmegaConf node whose keys are all declared in
:mod:`polyrl.config.schema` (which holds their defaults), so read them as attributes
(``config.clip_ratio``). A plugin's own knobs live in ``plugins.<name>``; read them with
:func:`polyrl.config.keys.plugin_settings`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from polyrl.batch import Batch


class AdvantageEstimatorFn(Protocol):
    """``(advantages[B, T], returns[B, T]) = fn(batch, config)``.

    Reads ``batch["token_level_rewards"]``, ``batch["response_mask"]`` and ``batch["uid"]``
    (the default :data:`polyrl.specs.ESTIMATOR_KEYS`) plus whatever else its spec's ``requires``
    lists (``batch["values"]`` for a critic-based estimator). Both outputs are zero where
    ``response_mask`` is zero; the batch is not modified.
    """

    def __call__(self, batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]: ...


class PolicyLossFn(Protocol):
    """``(loss_matrix[B, T], metrics) = fn(batch, log_prob, config)``.

    ``log_prob`` is the current policy's per-token log-probability (it carries the gradient); the
    rest comes from the batch: ``batch["old_log_probs"]``, ``batch["advantages"]`` and
    ``batch["response_mask"]`` (the default :data:`polyrl.specs.POLICY_LOSS_KEYS`), plus any
    other key its spec's ``requires`` lists.

    Return the per-token loss (to be minimised); the trainer aggregates it with
    ``actor.loss_agg_mode`` so every loss works with every aggregation. ``metrics`` maps names such
    as ``pg_clipfrac`` / ``ppo_kl`` to scalar tensors or floats (reported as ``actor/<name>``).
    """

    def __call__(
        self, batch: Batch, log_prob: torch.Tensor, config: Any
    ) -> tuple[torch.Tensor, dict[str, Any]]: ...
