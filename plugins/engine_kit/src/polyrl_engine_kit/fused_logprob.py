"""Token log-probs and entropy straight from the last hidden states and the output embedding,
without a float32 ``[tokens, vocab]`` tensor.

Why: with a 150k vocabulary the float32 log-softmax of a micro-batch (and its saved output for
backward) is the largest tensor of a step, several times the model's activations, and moving it
through memory costs more than the output matmul itself. Here the logits stay in the compute
dtype (bf16 on GPU) as the matmul writes them; the float32 softmax statistics are taken a chunk
of tokens at a time, and backward turns each chunk into the logits' gradient in place, so the
peak is the bf16 logits plus one float32 chunk. The matmuls are the same two a ``nn.Linear``
runs, so the gradient reaches the (FSDP-managed) weight as usual.

For a token with logits ``z`` (divided by the temperature ``T``), ``lse = logsumexp(z)``,
``log p = z - lse``, ``entropy = -sum(p * log p)``; the gradient with respect to ``z`` is
``g_logp * (onehot - p) - g_ent * p * (log p + entropy)``, divided by ``T`` for the logits.
Asked for, ``sum_pi_squared = exp(logsumexp(2 z) - 2 lse)`` (``sum_v p_v^2``, verl's formula)
comes from the same chunk, without grad.

The per-chunk statistics and gradient are compiled on CUDA (:mod:`.compiling`): eagerly each is
a dozen kernels, each a full float32 pass over ``[chunk, vocab]`` (more time than the output
matmul itself); compiled, they fuse into a few reductions that read the bf16 logits a few times.
"""

from __future__ import annotations

from typing import Any

import torch

from polyrl_engine_kit.compiling import compiled_on_cuda
from polyrl_engine_kit.logprob import TokenScores, check_temperature

# Float32 elements per chunk of the softmax statistics: 2**26 floats = 256 MiB.
_CHUNK_ELEMENTS = 1 << 26


def token_chunks(tokens: int, vocab: int) -> list[slice]:
    """Slices of ``tokens`` rows whose ``[rows, vocab]`` float32 statistics fit one chunk."""
    per_chunk = max(1, _CHUNK_ELEMENTS // max(1, vocab))
    return [slice(start, min(start + per_chunk, tokens)) for start in range(0, tokens, per_chunk)]


@compiled_on_cuda
def _statistics(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    with_squares: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 ``lse``, ``log p(label)``, entropy and ``sum_v p_v^2`` (zeros unless asked for)
    of one chunk of logits."""
    z = logits.float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    log_prob = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if with_entropy:
        log_p = z - lse.unsqueeze(-1)
        entropy = -(log_p.exp() * log_p).sum(dim=-1)
    else:
        entropy = torch.zeros_like(lse)
    squares = (
        (torch.logsumexp(2.0 * z, dim=-1) - 2.0 * lse).exp()
        if with_squares
        else torch.zeros_like(lse)
    )
    return lse, log_prob, entropy, squares


@compiled_on_cuda
def _logits_grad(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    grad_log_prob: torch.Tensor,
    grad_entropy: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> torch.Tensor:
    """The gradient with respect to one chunk of logits, in the logits' dtype."""
    z = logits.float() / temperature
    log_p = z - lse.unsqueeze(-1)
    p = log_p.exp()
    vocab = torch.arange(logits.shape[-1], device=logits.device)
    onehot = (vocab.unsqueeze(0) == labels.unsqueeze(-1)).to(p.dtype)
    grad = (onehot - p) * grad_log_prob.unsqueeze(-1)
    if with_entropy:
        entropy = -(p * log_p).sum(dim=-1, keepdim=True)
        grad = grad - grad_entropy.unsqueeze(-1) * p * (log_p + entropy)
    return (grad / temperature).to(logits.dtype)


class _LinearLogProb(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        with_squares: bool,
        compiled: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        statistics = _statistics if compiled else _statistics.__wrapped__
        logits = hidden @ weight.t()
        tokens, vocab = logits.shape
        lse = logits.new_empty(tokens, dtype=torch.float32)
        log_prob = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if with_entropy else lse.new_empty(0)
        squares = torch.empty_like(lse) if with_squares else lse.new_empty(0)
        for rows in token_chunks(tokens, vocab):
            lse[rows], log_prob[rows], ent, sq = statistics(
                logits[rows], labels[rows], temperature, with_entropy, with_squares
            )
            if with_entropy:
                entropy[rows] = ent
            if with_squares:
                squares[rows] = sq
        ctx.save_for_backward(hidden, weight, labels, logits, lse)
        ctx.temperature = temperature
        ctx.compiled = compiled
        ctx.mark_non_differentiable(squares)
        ctx.set_materialize_grads(False)  # an unused output (a detached entropy) gets None
        return log_prob, entropy, squares

    @staticmethod
    def backward(
        ctx: Any,
        grad_log_prob: torch.Tensor | None,
        grad_entropy: torch.Tensor | None,
        _grad_squares: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None, None]:
        hidden, weight, labels, logits, lse = ctx.saved_tensors
        with_entropy = grad_entropy is not None and grad_entropy.numel() > 0
        if grad_log_prob is None:
            grad_log_prob = torch.zeros_like(lse)
        if not with_entropy:
            grad_entropy = torch.zeros_like(lse)
        # The saved logits are ours alone (never returned): each chunk is overwritten with its
        # gradient, so backward needs no second [tokens, vocab] buffer.
        logits_grad = _logits_grad if ctx.compiled else _logits_grad.__wrapped__
        for rows in token_chunks(*logits.shape):
            logits[rows] = logits_grad(
                logits[rows],
                labels[rows],
                lse[rows],
                grad_log_prob[rows],
                grad_entropy[rows],
                ctx.temperature,
                with_entropy,
            )
        grad_hidden = logits @ weight if ctx.needs_input_grad[0] else None
        grad_weight = logits.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None, None


def linear_log_prob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    compiled: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(hidden @ weight.T / T)`` at ``labels`` and (``with_entropy``) the entropy;
    the softmax statistics compiled on CUDA unless ``compiled`` is false.

    ``hidden``: ``[M, H]``, ``weight``: ``[V, H]`` (an output embedding without bias),
    ``labels``: ``[M]``. Returns float32 ``[M]`` tensors; both carry grad when the inputs do.
    """
    scores = linear_scores(hidden, weight, labels, temperature, with_entropy, False, compiled)
    return scores.log_prob, scores.entropy


def linear_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    with_sum_pi_squared: bool = False,
    compiled: bool = True,
) -> TokenScores:
    """:func:`linear_log_prob`, and with ``with_sum_pi_squared`` also ``sum_v p_v^2`` of the
    tempered distribution (``[M]``, without grad)."""
    check_temperature(temperature)
    log_prob, entropy, squares = _LinearLogProb.apply(
        hidden,
        weight.to(hidden.dtype),
        labels.long(),
        float(temperature),
        with_entropy,
        with_sum_pi_squared,
        compiled,
    )
    return TokenScores(
        log_prob,
        entropy if with_entropy else None,
        squares if with_sum_pi_squared else None,
    )
