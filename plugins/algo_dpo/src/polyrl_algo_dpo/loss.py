"""DPO and IPO as polyrl policy losses, and the preference metrics under TRL's names.

Rows come in pairs: row ``2i`` is pair ``i``'s chosen response, row ``2i + 1`` its rejected one
(:func:`polyrl_algo_dpo.preference.collate_pairs`). With ``s = sum_t log pi(y_t)`` a response's
log-prob under the policy and ``s_ref`` under the reference (the ``ref`` role's
``ref_log_prob``), the implicit rewards are ``r = beta * (s - s_ref)`` and, per pair,

    h = (s_chosen - s_ref_chosen) - (s_rejected - s_ref_rejected)
    dpo  (TRL's loss_type="sigmoid", Rafailov et al. 2023):  L = -log sigmoid(beta * h)
    ipo  (TRL's loss_type="ipo", Azar et al. 2023):          L = (h - 1 / (2 * beta))^2

where IPO, as TRL does, averages each response's log-probs over its tokens instead of summing.
Metrics (TRL's): ``rewards/chosen``, ``rewards/rejected`` (mean implicit rewards),
``rewards/accuracies`` (share of pairs whose chosen reward is the higher), ``rewards/margins``
(mean difference), ``logps/chosen``, ``logps/rejected`` (mean policy log-probs).

Both are sequence-level losses (``PolicyLossSpec(level="sequence")``): each returns one value
per row, ``L_i`` on both rows of pair ``i``, and the actor averages them over the mini-batch's
rows, which is exactly the mean of ``L_i`` over pairs, also when mini-batches are cut into
micro-batches of whole pairs. No per-token spreading, so ``loss_agg_mode`` plays no part.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from polyrl_algo_dpo.config import LOSS_TYPES, dpo_settings

if TYPE_CHECKING:
    from polyrl.api import Batch


@dataclass
class PairTerms:
    """Per pair: the loss, the implicit rewards, and the policy's log-probs (TRL's logps)."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    chosen_logps: torch.Tensor
    rejected_logps: torch.Tensor

    @classmethod
    def concat(cls, parts: list[PairTerms]) -> PairTerms:
        """The terms of all pairs of ``parts``, in order."""
        return cls(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    def metrics(self) -> dict[str, float]:
        """TRL's names and definitions, averaged over the pairs."""
        with torch.no_grad():
            margins = self.chosen_rewards - self.rejected_rewards
            return {
                "rewards/chosen": float(self.chosen_rewards.mean()),
                "rewards/rejected": float(self.rejected_rewards.mean()),
                "rewards/accuracies": float((margins > 0).float().mean()),
                "rewards/margins": float(margins.mean()),
                "logps/chosen": float(self.chosen_logps.mean()),
                "logps/rejected": float(self.rejected_logps.mean()),
            }


def response_log_probs(
    log_prob: torch.Tensor, response_mask: torch.Tensor, average: bool
) -> torch.Tensor:
    """Each row's response log-prob ``[rows]``: the sum over its tokens, or the mean."""
    mask = response_mask.to(log_prob.dtype)
    total = (log_prob * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1.0) if average else total


def pair_terms(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    loss_type: str,
) -> PairTerms:
    """The terms of every pair of a batch of interleaved pairs (see the module docstring)."""
    rows = log_prob.shape[0]
    if rows % 2:
        raise ValueError(
            f"a preference loss got {rows} rows: rows come in pairs (chosen, rejected), so "
            "something split a pair (a micro-batch of odd size, or a reordering of rows)"
        )
    average = loss_type == "ipo"
    policy = response_log_probs(log_prob, response_mask, average)
    ref = response_log_probs(ref_log_prob.to(log_prob.dtype), response_mask, average)
    chosen_ratio, rejected_ratio = policy[0::2] - ref[0::2], policy[1::2] - ref[1::2]
    margin = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * margin)
    elif loss_type == "ipo":
        losses = (margin - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"unknown preference loss type {loss_type!r}; use sigmoid or ipo")
    return PairTerms(
        losses=losses,
        chosen_rewards=beta * chosen_ratio.detach(),
        rejected_rewards=beta * rejected_ratio.detach(),
        chosen_logps=policy[0::2].detach(),
        rejected_logps=policy[1::2].detach(),
    )


def _pair_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any, loss_type: str
) -> tuple[torch.Tensor, dict[str, float]]:
    mask = batch["response_mask"]
    terms = pair_terms(log_prob, batch["ref_log_prob"], mask, dpo_settings(config).beta, loss_type)
    return terms.losses.repeat_interleave(2), terms.metrics()


def dpo_loss(batch: Batch, log_prob: torch.Tensor, config: Any) -> tuple[torch.Tensor, dict]:
    """DPO's sigmoid loss, one value per row (its pair's; see the module docstring). Reads
    ``ref_log_prob`` and ``response_mask``; ``plugins.dpo.beta`` from the config's root."""
    return _pair_loss(batch, log_prob, config, LOSS_TYPES["dpo"])


def ipo_loss(batch: Batch, log_prob: torch.Tensor, config: Any) -> tuple[torch.Tensor, dict]:
    """IPO's squared loss on token-averaged log-probs, one value per row (as
    :func:`dpo_loss`)."""
    return _pair_loss(batch, log_prob, config, LOSS_TYPES["ipo"])
