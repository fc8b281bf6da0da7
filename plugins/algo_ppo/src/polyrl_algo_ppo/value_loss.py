"""The critic's clipped value loss (PPO, as in verl and TRL) and its micro-batch loss function.

Per token, with the new prediction ``v``, the value ``v_old`` the step started with and the
return ``R``::

    v_clip = clamp(v, v_old - cliprange_value, v_old + cliprange_value)
    loss   = 0.5 * max((v - R)^2, (v_clip - R)^2)

aggregated with ``critic.loss_agg_mode``. The clip keeps one update from moving a value far from
the one its advantage was computed with; ``critic/vf_clipfrac`` is the share of tokens where the
clipped term is the larger one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import agg_loss, check_loss_agg_mode, masked_mean

if TYPE_CHECKING:
    from polyrl.api import Batch, MicroBatchValueLossFn


def clipped_value_loss(
    vpreds: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token loss ``[B, T]`` above, and where its clipped term is the larger one."""
    clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_loss = (vpreds - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped_loss, clipped_loss), clipped_loss > unclipped_loss


def make_value_loss_fn(critic_cfg: Any) -> MicroBatchValueLossFn:
    """The critic's :class:`~polyrl.interfaces.training_engine.MicroBatchValueLossFn`.

    Reads ``cliprange_value`` and ``loss_agg_mode`` from the ``critic`` node. Like the actor's
    loss, it is normalised by the mini-batch totals in ``meta["loss_norm"]`` (all ranks), so the
    micro-batch losses sum to the mini-batch's; the logged metrics are the micro-batch's own.
    """
    mode = check_loss_agg_mode(str(critic_cfg.loss_agg_mode))
    cliprange = float(critic_cfg.cliprange_value)

    def value_loss(
        micro_batch: Batch, vpreds: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = micro_batch["response_mask"]
        loss_mat, clipped = clipped_value_loss(
            vpreds, micro_batch["values"], micro_batch["returns"], cliprange
        )
        norm = dict(micro_batch.meta.get("loss_norm") or {})
        metrics = {
            "critic/vf_loss": float(agg_loss(loss_mat.detach(), mask, mode)),
            "critic/vf_clipfrac": float(masked_mean(clipped.float(), mask)),
            "critic/vpred_mean": float(masked_mean(vpreds.detach(), mask)),
        }
        return agg_loss(loss_mat, mask, mode, **norm), metrics

    return value_loss
