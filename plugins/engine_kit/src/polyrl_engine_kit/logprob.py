"""Per-token log-probabilities, entropy and ``sum_pi_squared`` from logits, without needless
``[B, T, V]`` copies.

Vocabularies of 150k entries make the logits the largest tensor of a step. Without grad we work
on a few rows at a time (each chunk's float32 ``log_softmax`` is freed before the next), so the
peak is one chunk, not the batch. With grad, autograd keeps the ``log_softmax`` output for the
backward pass anyway; we keep only that one float32 copy (``log_softmax`` saves its output, not
its input) and compute a metric-only entropy from it under ``no_grad``.

``sum_pi_squared`` (verl's ``actor.calculate_sum_pi_squared``, read by the optimal-token
baselines) is ``sum_v p_v^2`` of the same tempered distribution, taken from each chunk's
``log_softmax`` as ``exp(logsumexp(2 log p))`` (verl's ``logsumexp(2z) - 2 logsumexp(z)``, the
same number), so asking for it adds a reduction per chunk, not a second softmax.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import NamedTuple

import torch

# Elements of float32 work per no-grad chunk: 2**25 floats = 128 MiB.
_CHUNK_ELEMENTS = 1 << 25


class EntropyMode(str, Enum):
    """What entropy to return: none, one that carries grad (entropy bonus), or a detached one."""

    NONE = "none"
    GRAD = "grad"
    DETACHED = "detached"


class TokenScores(NamedTuple):
    """float32 ``[..., r]`` scores of the response tokens; entropy and ``sum_pi_squared`` are
    None unless asked for."""

    log_prob: torch.Tensor
    entropy: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None


def check_temperature(temperature: float) -> None:
    """Scoring divides the logits by the sampling temperature: it must be positive."""
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 to score tokens (got {temperature}); greedy decoding "
            f"corresponds to no temperature scaling, pass 1.0"
        )


def _scaled_log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    return torch.log_softmax(scaled, dim=-1)


def _entropy(log_p: torch.Tensor) -> torch.Tensor:
    return -(log_p.exp() * log_p).sum(dim=-1)


def sum_pi_squared_of(log_p: torch.Tensor) -> torch.Tensor:
    """``sum_v p_v^2`` of normalised log-probabilities ``log_p`` (``[..., V]``)."""
    return torch.logsumexp(2.0 * log_p, dim=-1).exp()


def token_logprob_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    entropy: EntropyMode = EntropyMode.NONE,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / T)`` at ``labels`` and the entropy of that distribution.

    ``logits``: ``[b, r, V]`` (any float dtype), ``labels``: ``[b, r]``. Returns float32
    ``[b, r]`` tensors; entropy is ``None`` for :attr:`EntropyMode.NONE`.
    """
    scores = token_scores(logits, labels, temperature, entropy)
    return scores.log_prob, scores.entropy


def token_scores(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    entropy: EntropyMode = EntropyMode.NONE,
    sum_pi_squared: bool = False,
) -> TokenScores:
    """:func:`token_logprob_entropy`, and with ``sum_pi_squared`` also ``sum_v p_v^2`` of the
    tempered distribution (without grad: it is an input of the advantages, never of a loss)."""
    check_temperature(temperature)
    index = labels.long().unsqueeze(-1)
    if not torch.is_grad_enabled():
        return _chunked_no_grad(
            logits, index, temperature, entropy != EntropyMode.NONE, sum_pi_squared
        )
    log_p = _scaled_log_softmax(logits, temperature)
    log_prob = log_p.gather(-1, index).squeeze(-1)
    squares = _chunked(log_p.detach(), sum_pi_squared_of) if sum_pi_squared else None
    if entropy == EntropyMode.GRAD:
        return TokenScores(log_prob, _entropy(log_p), squares)
    if entropy == EntropyMode.DETACHED:
        return TokenScores(log_prob, _chunked(log_p.detach(), _entropy), squares)
    return TokenScores(log_prob, None, squares)


@torch.no_grad()
def _chunked(log_p: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``reduce`` over the vocabulary a few rows at a time: its temporaries are
    ``[rows, r, V]``."""
    rows, width, vocab = log_p.shape
    per_chunk = max(1, _CHUNK_ELEMENTS // max(1, width * vocab))
    parts = [reduce(log_p[start : start + per_chunk]) for start in range(0, rows, per_chunk)]
    return torch.cat(parts) if parts else log_p.new_zeros((0, width))


def _chunked_no_grad(
    logits: torch.Tensor,
    index: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    with_squares: bool,
) -> TokenScores:
    rows, width, vocab = logits.shape
    per_chunk = max(1, _CHUNK_ELEMENTS // max(1, width * vocab))
    log_probs, entropies, squares = [], [], []
    for start in range(0, rows, per_chunk):
        log_p = _scaled_log_softmax(logits[start : start + per_chunk], temperature)
        log_probs.append(log_p.gather(-1, index[start : start + per_chunk]).squeeze(-1))
        if with_entropy:
            entropies.append(_entropy(log_p))
        if with_squares:
            squares.append(sum_pi_squared_of(log_p))
        del log_p

    def joined(parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts) if parts else logits.new_zeros((0, width)).float()

    return TokenScores(
        joined(log_probs),
        joined(entropies) if with_entropy else None,
        joined(squares) if with_squares else None,
    )
