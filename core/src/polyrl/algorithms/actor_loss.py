"""The actor's micro-batch loss: policy loss (weighted by the truncated importance-sampling
correction when ``tis_imp_ratio_cap`` is set, see :mod:`polyrl.algorithms.tis`) + entropy bonus +
KL loss, each aggregated with ``loss_agg_mode`` and normalised by the totals of the MINI-batch.

The training engine calls the returned function once per micro-batch and sums the gradients, so
the returned loss must be the micro-batch's share of the mini-batch loss. The trainer puts the
mini-batch totals in ``mini_batch.meta["loss_norm"]`` (see
:func:`polyrl.algorithms.loss_agg.loss_norm_totals`); micro-batches inherit ``meta``. Logged
metrics, in contrast, are the micro-batch's own plain aggregates, which the engine averages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.algorithms.kl import kl_penalty
from polyrl.algorithms.loss_agg import agg_loss, check_loss_agg_mode
from polyrl.algorithms.tis import truncated_is_weights
from polyrl.config.checks.off_policy import tis_enabled
from polyrl.specs import LOSS_LEVELS, SEQUENCE_LEVEL, TOKEN_LEVEL
from polyrl.step.names import ROLLOUT_IS_WEIGHTS

if TYPE_CHECKING:
    from polyrl.batch import Batch
    from polyrl.interfaces import MicroBatchLossFn, PolicyLossFn

LOSS_NORM_KEY = "loss_norm"


def _as_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().item())
    return float(value)


def make_actor_loss_fn(
    actor_cfg: Any, policy_loss_fn: PolicyLossFn, level: str = TOKEN_LEVEL
) -> MicroBatchLossFn:
    """Build the :class:`~polyrl.interfaces.MicroBatchLossFn` of the actor update.

    ``level`` is the policy loss's (:attr:`polyrl.specs.PolicyLossSpec.level`): a token-level
    loss's ``[B, T]`` matrix is aggregated with ``loss_agg_mode``; a sequence-level loss's
    ``[B]`` values are averaged over the mini-batch's rows (``num_seqs`` of the loss norm).

    Reads ``loss_agg_mode``, ``entropy_coeff``, ``use_kl_loss``, ``kl_loss_coef``,
    ``kl_loss_type`` and ``tis_imp_ratio_cap`` from ``actor_cfg`` (the
    ``actor_rollout_ref.actor`` node); the policy loss gets the same node for its own knobs.
    An algorithm that needs another aggregation (Dr.GRPO) sets ``loss_agg_mode`` through its
    config defaults, so the value read here is the one ``polyrl config`` shows.

    The micro-batch must hold the keys the policy loss reads (``old_log_probs``, ``advantages``,
    ``response_mask`` and whatever its spec's ``requires`` adds), ``ref_log_prob`` when
    ``use_kl_loss``, and ``rollout_log_probs`` when the TIS correction is on. A micro-batch
    with ``rollout_is_weights`` (a plugin's stage added them: verl's decoupled rollout
    correction) has its token-level policy loss multiplied by them, as verl's losses do.
    """
    mode = check_loss_agg_mode(actor_cfg.loss_agg_mode)
    entropy_coeff = float(actor_cfg.entropy_coeff)
    use_kl_loss = bool(actor_cfg.use_kl_loss)
    kl_coef = float(actor_cfg.kl_loss_coef)
    kl_type = str(actor_cfg.kl_loss_type)
    tis_cap = float(actor_cfg.tis_imp_ratio_cap)
    if level not in LOSS_LEVELS:
        raise ValueError(f"policy loss level {level!r}: use one of {', '.join(LOSS_LEVELS)}")

    def actor_loss(
        micro_batch: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = micro_batch["response_mask"]
        norm = dict(micro_batch.meta.get(LOSS_NORM_KEY) or {})

        def aggregate(mat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """(share of the mini-batch loss, the micro-batch's own aggregate for logging)."""
            own = agg_loss(mat, mask, mode)
            if not norm:
                return own, own
            scaled = agg_loss(
                mat,
                mask,
                mode,
                num_seqs=norm.get("num_seqs"),
                num_tokens=norm.get("num_tokens"),
                max_len=norm.get("max_len"),
                dp_size=norm.get("dp_size"),
            )
            return scaled, own

        pg_out, pg_metrics = policy_loss_fn(micro_batch, log_prob, actor_cfg)
        if level == SEQUENCE_LEVEL:
            if ROLLOUT_IS_WEIGHTS in micro_batch:
                raise ValueError(
                    f"the batch has per-token {ROLLOUT_IS_WEIGHTS} and the policy loss is "
                    f"sequence-level: a token-level loss is needed to apply them"
                )
            loss, pg_loss = _sequence_mean(pg_out, norm)
        else:
            if ROLLOUT_IS_WEIGHTS in micro_batch:
                pg_out = pg_out * micro_batch[ROLLOUT_IS_WEIGHTS]
            if tis_enabled(tis_cap):
                weights, tis_metrics = truncated_is_weights(
                    micro_batch["old_log_probs"], micro_batch["rollout_log_probs"], mask, tis_cap
                )
                pg_out = pg_out * weights
                pg_metrics = {**pg_metrics, **tis_metrics}
            loss, pg_loss = aggregate(pg_out)
        metrics = {"actor/pg_loss": _as_float(pg_loss)}
        metrics.update({_metric_name(k): _as_float(v) for k, v in pg_metrics.items()})

        if entropy is not None:
            entropy_share, entropy_own = aggregate(entropy)
            metrics["actor/entropy"] = _as_float(entropy_own)
            if entropy_coeff != 0.0:
                loss = loss - entropy_coeff * entropy_share

        if use_kl_loss:
            if "ref_log_prob" not in micro_batch:
                raise KeyError(
                    "actor_rollout_ref.actor.use_kl_loss=true but the batch has no "
                    "'ref_log_prob'; the trainer must compute reference log-probs"
                )
            kld = kl_penalty(log_prob, micro_batch["ref_log_prob"], kl_type)
            kl_share, kl_own = aggregate(kld)
            loss = loss + kl_coef * kl_share
            metrics["actor/kl_loss"] = _as_float(kl_own)
            metrics["actor/kl_coef"] = kl_coef
        return loss, metrics

    actor_loss.needs_entropy_grad = entropy_coeff != 0.0  # type: ignore[attr-defined]
    return actor_loss


def _metric_name(name: str) -> str:
    """A policy loss's metric as logged: a bare name (``pg_clipfrac``) under ``actor/``; a name
    that already has its group (``rollout_corr/rollout_is_mean``, verl's) as given, so a loss
    can report under the names verl logs."""
    return name if "/" in name else f"actor/{name}"


def _sequence_mean(per_row: torch.Tensor, norm: dict[str, Any]) -> tuple[torch.Tensor, Any]:
    """(share of the mini-batch's mean over rows, the micro-batch's own mean) of a
    sequence-level loss's ``[B]`` values."""
    if per_row.dim() != 1:
        raise ValueError(
            f"a sequence-level policy loss must return one value per row, shape [B]; got "
            f"{tuple(per_row.shape)}"
        )
    own = per_row.mean()
    if not norm:
        return own, own
    return per_row.sum() / float(norm["num_seqs"]), own
