"""Reduce a per-token loss matrix ``[B, T]`` to the scalar that is minimised.

The aggregation decides how much each token and each sequence weighs, and that is an algorithmic
choice (DAPO, GRPO and Dr.GRPO differ exactly here), so it is a config value
(``actor_rollout_ref.actor.loss_agg_mode``), independent of the policy loss.

Micro-batching: the trainer splits a mini-batch into micro-batches, calls ``backward`` on each
and steps once, so the micro-batch losses must SUM to the mini-batch loss. Every mode here is a
sum over rows divided by a constant of the mini-batch, so passing the mini-batch's totals
(``num_seqs``, ``num_tokens``, ``max_len``; see :func:`loss_norm_totals`) as denominators makes
that exact. Without them each micro-batch is aggregated on its own.

Data parallelism averages the ranks' gradients. The means divide by totals over all ranks that
the trainer has already divided by the rank count, which cancels the average; ``token-sum`` has
no denominator, so it multiplies by ``dp_size`` instead (verl does the same).
"""

from __future__ import annotations

import torch

from polyrl.algorithms.functional import masked_mean, masked_sum
from polyrl.errors import ConfigError

TOKEN_MEAN = "token-mean"
TOKEN_SUM = "token-sum"
SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"
LOSS_AGG_MODES = (
    TOKEN_MEAN,
    TOKEN_SUM,
    SEQ_MEAN_TOKEN_SUM,
    SEQ_MEAN_TOKEN_MEAN,
    SEQ_MEAN_TOKEN_SUM_NORM,
)


class LossAggModeError(ConfigError, ValueError):
    """An unknown ``loss_agg_mode`` (a ``ValueError`` too, for callers outside polyrl)."""


def check_loss_agg_mode(mode: str) -> str:
    """Return ``mode`` or raise :class:`LossAggModeError` listing the valid modes."""
    if mode not in LOSS_AGG_MODES:
        raise LossAggModeError(
            f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)} "
            f"(config key actor_rollout_ref.actor.loss_agg_mode)"
        )
    return mode


def loss_norm_totals(response_mask: torch.Tensor, max_len: int | None = None) -> dict[str, int]:
    """The denominators of a mini-batch, to store in ``mini_batch.meta["loss_norm"]``.

    ``num_seqs`` counts rows with at least one response token: all-padding rows (added to make a
    batch divisible by the data-parallel size) must not dilute the mean. ``max_len`` is the
    response width unless given; pass ``data.max_response_length`` for a divisor that stays
    constant over training, as Dr.GRPO intends.
    """
    mask = response_mask.detach()
    return {
        "num_seqs": int((mask.sum(dim=-1) > 0).sum().item()),
        "num_tokens": int(mask.sum().item()),
        "max_len": int(max_len if max_len is not None else mask.shape[-1]),
    }


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_seqs: int | None = None,
    num_tokens: int | None = None,
    max_len: int | None = None,
    dp_size: int | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat[B, T]`` over the tokens where ``mask`` is 1.

    - ``token-mean``: ``sum(loss * mask) / num_tokens`` -- every token weighs the same (DAPO).
    - ``token-sum``: ``sum(loss * mask) * dp_size`` -- the mini-batch's plain sum: the step
      grows with the number of tokens, which the learning rate then has to absorb.
    - ``seq-mean-token-sum``: ``sum_i(sum_t loss_it) / num_seqs``.
    - ``seq-mean-token-mean``: ``sum_i(mean_t loss_it) / num_seqs`` -- every sequence weighs the
      same, whatever its length (the original GRPO objective).
    - ``seq-mean-token-sum-norm``: ``sum_i(sum_t loss_it / max_len) / num_seqs``, i.e.
      ``sum(loss * mask) / (num_seqs * max_len)`` -- Dr.GRPO's ``1/G * sum_i sum_t``: each
      sequence's token sum divided by one constant instead of its own length (which would bias
      towards long wrong answers), then averaged over sequences so the scale does not grow with
      the batch size. verl computes the same (its ``loss_scale_factor`` is our ``max_len``).

    Defaults when a denominator is not given: ``num_tokens`` = masked-in tokens, ``num_seqs`` =
    rows with at least one masked-in token, ``max_len`` = ``T``, ``dp_size`` = 1 (the other
    modes ignore it). An empty mask gives 0.
    """
    check_loss_agg_mode(mode)
    if mode == TOKEN_SUM:
        ranks = 1 if dp_size is None else _positive(dp_size, "dp_size")
        return masked_sum(loss_mat, mask) * ranks
    if mode == TOKEN_MEAN:
        if num_tokens is None:
            return masked_mean(loss_mat, mask)
        return masked_sum(loss_mat, mask) / _positive(num_tokens, "num_tokens")

    row_tokens = mask.to(loss_mat.dtype).sum(dim=-1)
    if num_seqs is None:
        num_seqs = int((row_tokens > 0).sum().item())
        if num_seqs == 0:
            return masked_sum(loss_mat, mask)  # zero, but still attached to the graph
    denom = _positive(num_seqs, "num_seqs")
    if mode == SEQ_MEAN_TOKEN_SUM:
        return masked_sum(loss_mat, mask, dim=-1).sum() / denom
    if mode == SEQ_MEAN_TOKEN_MEAN:
        return masked_mean(loss_mat, mask, dim=-1).sum() / denom
    width = loss_mat.shape[-1] if max_len is None else _positive(max_len, "max_len")
    return masked_sum(loss_mat, mask) / (denom * width)


def _positive(value: int, name: str) -> int:
    if value <= 0:
        raise ValueError(f"agg_loss: {name} must be positive, got {value}")
    return value
