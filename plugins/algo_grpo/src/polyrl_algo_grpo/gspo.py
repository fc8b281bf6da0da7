"""GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization"): clip a SEQUENCE-level
importance ratio instead of per-token ratios.

The sequence ratio is the geometric mean of the token ratios, length-normalised so that long
and short responses live on one scale:

    s_i = exp( 1/|y_i| * sum_t (log pi(y_it) - log pi_old(y_it)) )

and the per-token loss is the PPO surrogate with ``s_i`` in place of ``r_it``. We use the
paper's "GSPO-token" form: the ratio of token t is ``sg(s_i) * pi(y_it) / sg(pi(y_it))`` -- its
value is ``s_i`` on every token, and its gradient flows through that token's own log-prob. With
one advantage per sequence this is exactly GSPO's gradient once the matrix is aggregated with
``loss_agg_mode=seq-mean-token-mean`` (``1/G sum_i 1/|y_i| sum_t``); per-token advantages also
work. Because the whole sequence is clipped at once, GSPO uses far smaller clip ranges than PPO
(the paper: ``clip_ratio_low=3e-4``, ``clip_ratio_high=4e-4``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import clip_ratios, clipped_surrogate, masked_mean

if TYPE_CHECKING:
    from polyrl.api import Batch

LOG_SEQ_RATIO_MAX = 10.0  # exp(10) ~ 2.2e4: enough to be clipped, far from overflow


def gspo_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token GSPO loss ``[B, T]`` (zero on padding) and metrics ``pg_clipfrac`` (share of
    masked tokens whose sequence ratio was clipped), ``pg_clipfrac_lower`` (always 0) and
    ``ppo_kl`` (mean of ``old_log_probs - log_prob`` over masked tokens).

    Reads ``old_log_probs``, ``advantages`` and ``response_mask`` from ``batch``, and
    ``clip_ratio``, ``clip_ratio_low`` and ``clip_ratio_high`` from ``config``."""
    old_log_prob = batch["old_log_probs"]
    advantages = batch["advantages"]
    low, high = clip_ratios(config)
    mask = batch["response_mask"].to(log_prob.dtype)
    token_log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(token_log_ratio, mask, dim=-1)  # [B]; 0 for an empty row
    log_ratio = (
        log_prob
        - log_prob.detach()
        + torch.clamp(seq_log_ratio, max=LOG_SEQ_RATIO_MAX).detach().unsqueeze(-1)
    )
    loss_mat, clipped = clipped_surrogate(log_ratio, advantages, low, high)
    loss_mat = torch.where(mask != 0, loss_mat, torch.zeros_like(loss_mat))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(clipped.to(log_prob.dtype), mask),
            # GSPO has no dual clip, so the share of dual-clipped tokens is 0 by definition;
            # reported (as verl does) so that dashboards comparing it with vanilla PPO line up.
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-token_log_ratio, mask),
        }
    return loss_mat, metrics
