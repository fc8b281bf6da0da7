"""Choosing the next token from logits, and the log-probability recorded for it.

Why a module of its own: the log-probability convention is what makes the rollout agree with
the trainer. The recorded value is ``log_softmax(logits / temperature)`` at the chosen token,
taken *before* top-k / top-p truncation: that is exactly what the training engine recomputes
for the same tokens at the same temperature, so on-policy importance ratios start at 1.
(Truncation only decides which tokens may be drawn; renormalising over the kept set would make
the rollout's numbers differ from the trainer's.) Greedy decoding records the temperature-1
log-softmax of the argmax token.
"""

from __future__ import annotations

import torch


def is_greedy(greedy: bool, temperature: float) -> bool:
    """Greedy when asked for, or when the temperature is 0 (verl's convention for validation)."""
    return bool(greedy) or temperature <= 0.0


def truncate_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to ``-inf`` the logits that top-k and then top-p (nucleus) exclude.

    ``top_k <= 0`` or ``>= vocab`` and ``top_p >= 1`` switch the respective filter off. Top-p keeps
    the smallest set of most likely tokens whose probability reaches ``top_p`` (at least one).
    """
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def pick_tokens(
    logits: torch.Tensor,
    *,
    greedy: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens ``[rows]`` and their float32 log-probs ``[rows]`` from logits ``[rows, V]``."""
    logits = logits.float()
    if is_greedy(greedy, temperature):
        tokens = logits.argmax(dim=-1)
        log_probs = torch.log_softmax(logits, dim=-1)
    else:
        scaled = logits / temperature
        log_probs = torch.log_softmax(scaled, dim=-1)
        probs = torch.softmax(truncate_logits(scaled, top_k, top_p), dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
