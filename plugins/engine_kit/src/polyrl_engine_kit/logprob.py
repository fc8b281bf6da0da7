"""Per-token log-probabilities and entropy from logits, without needless ``[B, T, V]`` copies.

Vocabularies of 150k entries make the logits the largest tensor of a step. Without grad we work
on a few rows at a time (each chunk's float32 ``log_softmax`` is freed before the next), so the
peak is one chunk, not the batch. With grad, autograd keeps the ``log_softmax`` output for the
backward pass anyway; we keep only that one float32 copy (``log_softmax`` saves its output, not
its input) and compute a metric-only entropy from it under ``no_grad``.
"""

from __future__ import annotations

from enum import Enum

import torch

# Elements of float32 work per no-grad chunk: 2**25 floats = 128 MiB.
_CHUNK_ELEMENTS = 1 << 25


class EntropyMode(str, Enum):
    """What entropy to return: none, one that carries grad (entropy bonus), or a detached one."""

    NONE = "none"
    GRAD = "grad"
    DETACHED = "detached"


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
    check_temperature(temperature)
    index = labels.long().unsqueeze(-1)
    if not torch.is_grad_enabled():
        return _chunked_no_grad(logits, index, temperature, entropy != EntropyMode.NONE)
    log_p = _scaled_log_softmax(logits, temperature)
    log_prob = log_p.gather(-1, index).squeeze(-1)
    if entropy == EntropyMode.GRAD:
        return log_prob, _entropy(log_p)
    if entropy == EntropyMode.DETACHED:
        return log_prob, _chunked_entropy(log_p.detach())
    return log_prob, None


@torch.no_grad()
def _chunked_entropy(log_p: torch.Tensor) -> torch.Tensor:
    """Entropy a few rows at a time: ``exp`` and the product are ``[rows, r, V]`` temporaries."""
    rows, width, vocab = log_p.shape
    per_chunk = max(1, _CHUNK_ELEMENTS // max(1, width * vocab))
    parts = [_entropy(log_p[start : start + per_chunk]) for start in range(0, rows, per_chunk)]
    return torch.cat(parts) if parts else log_p.new_zeros((0, width))


def _chunked_no_grad(
    logits: torch.Tensor, index: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    rows, width, vocab = logits.shape
    per_chunk = max(1, _CHUNK_ELEMENTS // max(1, width * vocab))
    log_probs, entropies = [], []
    for start in range(0, rows, per_chunk):
        log_p = _scaled_log_softmax(logits[start : start + per_chunk], temperature)
        log_probs.append(log_p.gather(-1, index[start : start + per_chunk]).squeeze(-1))
        if with_entropy:
            entropies.append(_entropy(log_p))
        del log_p
    log_prob = torch.cat(log_probs) if log_probs else logits.new_zeros((0, width)).float()
    if not with_entropy:
        return log_prob, None
    entropy = torch.cat(entropies) if entropies else logits.new_zeros((0, width)).float()
    return log_prob, entropy
