"""Per-token log-probs and entropy from logits whose vocabulary is split over tensor-parallel ranks.

Two ways in: :func:`vocab_parallel_logprob_entropy` scores logits the output layer wrote (float32
statistics over this rank's ``[b, r, V/tp]`` slice, saved for backward by autograd), and
:func:`vocab_parallel_linear_log_prob` starts from the final hidden states and this rank's rows of
the output embedding, keeping the logits in the compute dtype and the float32 statistics to one
chunk of tokens at a time (the fused path of :mod:`polyrl_engine_kit.fused_logprob`, with the
vocabulary split).

Each rank holds logits ``[b, r, V/tp]`` for its slice of the vocabulary; no rank ever builds the
full ``[b, r, V]``. The softmax normaliser ``Z``, the chosen token's logit and the entropy's
``sum(exp(l) * l)`` are sums over the vocabulary: each rank sums its slice and one all-reduce
adds them (megatron's ``reduce_from_tensor_model_parallel_region``, whose backward passes the
gradient through unchanged: every rank computes the same loss from the reduced values, so each
rank's slice gets its own gradient). That holds only if every reduced summand depends on this
rank's logits alone, so anything that uses a reduced value (dividing by ``Z``) comes after the
reduction. The maximum subtracted for stability is a constant (no gradient). Vocabulary padding
(rows added so that the vocabulary splits evenly) is left out.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from polyrl_engine_kit.fused_logprob import token_chunks
from polyrl_engine_kit.logprob import EntropyMode, check_temperature


def _reduce(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(tensor, group=group)


def vocab_parallel_logprob_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float,
    entropy: EntropyMode,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / T)`` at ``labels`` ``[b, r]`` (float32) and, unless
    :attr:`EntropyMode.NONE`, the entropy of the distribution (with grad for
    :attr:`EntropyMode.GRAD`). ``logits``: this rank's ``[b, r, V/tp]`` slice; ``vocab_size``:
    the real vocabulary (the padded tail is ignored)."""
    check_temperature(temperature)
    rank, width = dist.get_rank(group), logits.shape[-1]
    start = rank * width
    real = min(width, vocab_size - start)  # the padding (< tp rows) never fills a whole slice
    scaled = logits[..., :real].float()
    if temperature != 1.0:
        scaled = scaled / temperature
    with torch.no_grad():
        top = scaled.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shifted = scaled - top.unsqueeze(-1)
    exp = shifted.exp()
    log_z = _reduce(exp.sum(dim=-1), group).log()
    local = labels.long() - start
    here = (local >= 0) & (local < real)
    picked = shifted.gather(-1, local.clamp(0, real - 1).unsqueeze(-1)).squeeze(-1)
    log_prob = _reduce(picked * here, group) - log_z
    if entropy == EntropyMode.NONE:
        return log_prob, None
    if entropy == EntropyMode.DETACHED:
        with torch.no_grad():
            return log_prob, _entropy(shifted.detach(), exp.detach(), log_z.detach(), group)
    return log_prob, _entropy(shifted, exp, log_z, group)


def _entropy(
    shifted: torch.Tensor, exp: torch.Tensor, log_z: torch.Tensor, group: Any
) -> torch.Tensor:
    """``H = log Z - sum_v exp_v * l_v / Z`` (logits ``l`` shifted by the maximum). The sum is
    reduced before dividing by ``Z``: each reduced summand must depend on this rank's logits
    only, or the pass-through backward would drop the other ranks' dependence on ``Z``."""
    return log_z - _reduce((exp * shifted).sum(dim=-1), group) / log_z.exp()


class _VocabParallelLinearLogProb(torch.autograd.Function):
    """Forward: this rank's logits ``hidden @ weight.T`` in the compute dtype; per chunk of
    tokens the float32 maximum, then (one all-reduce of the maxima) ``S = sum exp(z - max)``,
    the label's logit where this rank holds it, and ``sum exp(z - max) * (z - max)``, all three
    all-reduced at once. ``lse = max + log S``, ``log p(label) = z_label - lse``, entropy
    ``log S - sum exp(z - max) * (z - max) / S``.

    Backward: each chunk of the saved logits is overwritten with its gradient
    ``(onehot - p) * g_logp - g_ent * p * (log p + entropy)`` (over ``T``), which needs only this
    rank's logits and the reduced ``lse`` and entropy; the weight's gradient is this rank's
    alone, the hidden states' gradient is summed over the TP group (every rank used them).
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        vocab_size: int,
        temperature: float,
        with_entropy: bool,
        group: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = hidden @ weight.t()  # [M, V/tp]
        tokens, width = logits.shape
        start = dist.get_rank(group) * width
        real = min(width, vocab_size - start)  # the padding (< tp rows) never fills a slice
        local = labels - start
        here = (local >= 0) & (local < real)
        local = local.clamp(0, real - 1).unsqueeze(-1)
        top = logits.new_empty(tokens, dtype=torch.float32)
        for rows in token_chunks(tokens, real):
            top[rows] = logits[rows, :real].float().max(dim=-1).values / temperature
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        sums = top.new_zeros(3, tokens)  # S, the label's shifted logit, sum exp * shifted
        for rows in token_chunks(tokens, real):
            shifted = logits[rows, :real].float() / temperature - top[rows].unsqueeze(-1)
            exp = shifted.exp()
            sums[0, rows] = exp.sum(dim=-1)
            sums[1, rows] = shifted.gather(-1, local[rows]).squeeze(-1) * here[rows]
            if with_entropy:
                sums[2, rows] = (exp * shifted).sum(dim=-1)
        dist.all_reduce(sums, group=group)
        log_z = sums[0].log()
        log_prob = sums[1] - log_z
        entropy = log_z - sums[2] / sums[0] if with_entropy else log_z.new_empty(0)
        ctx.save_for_backward(hidden, weight, logits, top + log_z, entropy, local, here)
        ctx.real, ctx.temperature, ctx.group = real, temperature, group
        ctx.set_materialize_grads(False)  # an unused output (a detached entropy) gets None
        return log_prob, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_log_prob: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, logits, lse, entropy, local, here = ctx.saved_tensors
        real, temperature = ctx.real, ctx.temperature
        with_entropy = grad_entropy is not None and entropy.numel() > 0
        # Saved logits are ours alone (never returned): each chunk becomes its gradient.
        for rows in token_chunks(*logits.shape):
            log_p = logits[rows, :real].float() / temperature - lse[rows].unsqueeze(-1)
            p = log_p.exp()
            grad = torch.zeros_like(p)
            if grad_log_prob is not None:
                onehot = torch.zeros_like(p).scatter_(-1, local[rows], here[rows, None].float())
                grad = (onehot - p) * grad_log_prob[rows].unsqueeze(-1)
            if with_entropy:
                weight_of = grad_entropy[rows].unsqueeze(-1)
                grad = grad - weight_of * p * (log_p + entropy[rows].unsqueeze(-1))
            logits[rows, :real] = (grad / temperature).to(logits.dtype)
            logits[rows, real:] = 0
        grad_hidden = None
        if ctx.needs_input_grad[0]:
            grad_hidden = logits @ weight
            dist.all_reduce(grad_hidden, group=ctx.group)
        grad_weight = logits.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None, None


def vocab_parallel_linear_log_prob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float,
    entropy: EntropyMode,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(hidden @ W.T / T)`` at ``labels`` ``[M]`` (float32) and, unless
    :attr:`EntropyMode.NONE`, the entropy, where ``W`` is the whole output embedding and
    ``weight`` this rank's ``[V/tp, H]`` rows of it (padded to a multiple of TP;
    ``vocab_size``: the real vocabulary). ``hidden``: ``[M, H]``, the same on every rank of
    ``group``; the logits stay in its dtype. Every rank returns the same values."""
    check_temperature(temperature)
    with_entropy = entropy != EntropyMode.NONE
    log_prob, ent = _VocabParallelLinearLogProb.apply(
        hidden,
        weight.to(hidden.dtype),
        labels.long(),
        vocab_size,
        float(temperature),
        with_entropy,
        group,
    )
    if not with_entropy:
        return log_prob, None
    return log_prob, ent.detach() if entropy == EntropyMode.DETACHED else ent
