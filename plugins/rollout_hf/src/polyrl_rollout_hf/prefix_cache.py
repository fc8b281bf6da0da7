"""The KV of the last ``generate`` call (prompts, and responses where kept), found by tokens.

Why: a multi-turn rollout (:class:`polyrl.envs.rollout.MultiTurnRollout`) sends each episode's
whole context (first prompt, earlier turns, observations) back as the next turn's prompt, and the
engine stays stateless between turns, so every turn would prefill the context again: a cost that
grows with the turn. Here each prefill's keys and values are kept, and a later prompt whose real
tokens start with a kept prompt's tokens prefills only the tokens after it. The caller changes
nothing (a prompt that finds nothing is prefilled whole), and nothing here is episode state: a
restarted worker only prefills again.

What is kept: each prefill's own cache tensors (``[P, KV, W, D]`` per layer, each prompt's tokens
right-aligned, as :meth:`HFRolloutEngine._prefill` builds them: no copy is made) or, on the
continuous-batching path, each row's prompt and response KV copied out of its decode slot when the
row ends (:class:`~polyrl_rollout_hf.continuous.ContinuousBatch` with ``retain``; the prompts'
prefills are then not kept, since these extend them), so that the next turn prefills only the
observation; each under a key of the prompt's length and a hash of its tokens, a hit being
checked token by token. The keys are computed in numpy's wrapping 64-bit arithmetic, without a
modular division: every turn hashes every context on the host. Only the latest call's entries
are kept (the next turn's prompts extend them; older ones are dead), so the memory held between
calls is one call's KV; a weight update drops everything (the KV was computed with the old
weights), and so does :meth:`PrefixCache.clear` through the engine's ``reset_prefix_cache`` once
a multi-turn rollout's episodes have had their last turn.

A continued prefill computes what a fresh one computes: the same forward over the same tokens at
the same positions, with the earlier tokens' keys and values read instead of recomputed (equal up
to the rounding of another batch shape; a response token's KV from the decode step is the one the
fresh path's own decode used for it). A batch's rows prefill as many tokens as the row with most
new ones; a row with fewer computes some of its kept tokens again, from the same kept KV before
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# A prompt's key is its length and a polynomial hash of its tokens modulo 2^64 (numpy's unsigned
# arithmetic wraps); a hit is then checked token by token, so a collision costs a miss at most.
_BASE = np.uint64(1_000_003)


@dataclass
class Block:
    """One prefill's cache: ``layers[i] = (keys, values)`` of ``[P, KV, W, D]``, every prompt's
    real tokens in its last columns."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def width(self) -> int:
        return int(self.layers[0][0].shape[2])


@dataclass
class Hit:
    """Prompt ``row`` of ``block`` (``length`` real tokens) starts the prompt that found it."""

    block: Block
    row: int
    length: int


@dataclass
class _Entry:
    block: Block
    row: int
    tokens: Any  # the prompt's real tokens (a numpy row, or any sequence numpy compares)
    call: int


def right_aligned(mask: torch.Tensor) -> bool:
    """Whether every row of ``mask [P, W]`` is padding then real tokens, without holes."""
    lengths = mask.long().sum(dim=1, keepdim=True)
    columns = torch.arange(mask.shape[1], device=mask.device)
    return bool((mask.bool() == (columns >= mask.shape[1] - lengths)).all())


class PrefixCache:
    """The kept prefills, by prompt tokens; see the module docstring."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int], _Entry] = {}
        self._call = 0
        self._powers = np.ones(1, dtype=np.uint64)

    def __len__(self) -> int:
        return len(self._entries)

    def begin_call(self) -> None:
        """A ``generate`` call starts: what it stores belongs to it."""
        self._call += 1

    def end_call(self) -> None:
        """The call is over: only its own prompts are kept (the next turn extends them)."""
        self._entries = {k: e for k, e in self._entries.items() if e.call == self._call}

    def clear(self) -> None:
        self._entries.clear()

    # ---- keys ---------------------------------------------------------------------------------
    def _terms(self, ids: np.ndarray, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For left-padded ``ids``/``real [P, W]``: how many real tokens end at each column,
        and each real token's term of the key, ``(token + 1) * base^k`` for the row's ``k``-th
        real token (0 on padding)."""
        count = real.cumsum(axis=1)
        if self._powers.size < ids.shape[1]:
            steps = np.full(ids.shape[1], _BASE, dtype=np.uint64)
            steps[0] = 1
            self._powers = np.cumprod(steps, dtype=np.uint64)
        terms = (ids.astype(np.uint64) + np.uint64(1)) * self._powers[np.maximum(count - 1, 0)]
        terms[~real] = 0
        return count, terms

    # ---- lookup and store ---------------------------------------------------------------------
    def lookup(self, ids: torch.Tensor, mask: torch.Tensor) -> list[Hit | None]:
        """For each prompt of ``ids``/``mask [P, W]`` (right-aligned: left padding, then the
        real tokens; CPU): the longest kept prompt its real tokens start with, leaving at least
        one token to prefill, or None."""
        hits: list[Hit | None] = [None] * ids.shape[0]
        if not self._entries:
            return hits
        tokens, real = ids.numpy(), mask.numpy() != 0
        count, terms = self._terms(tokens, real)
        key = terms.cumsum(axis=1, dtype=np.uint64)  # the key of the tokens up to each column
        lengths = np.fromiter({length for length, _ in self._entries}, dtype=np.int64)
        total = count[:, -1]
        candidate = real & np.isin(count, lengths) & (count < total[:, None])
        rows, columns = candidate.nonzero()
        found = zip(rows.tolist(), count[rows, columns].tolist(), key[rows, columns].tolist())
        width = ids.shape[1]
        for r, length, row_key in found:
            entry = self._entries.get((length, row_key))
            best = hits[r]
            if entry is None or (best is not None and best.length >= length):
                continue
            start = width - int(total[r])
            if np.array_equal(tokens[r, start : start + length], entry.tokens):
                hits[r] = Hit(entry.block, entry.row, length)
        return hits

    def store(self, ids: torch.Tensor, mask: torch.Tensor, block: Block) -> None:
        """Keep the prefill ``block`` of prompts ``ids``/``mask [P, W]`` (right-aligned, CPU,
        the columns of the block), each under its real tokens."""
        tokens, real = ids.numpy().copy(), mask.numpy() != 0  # the caller may reuse its ids
        count, terms = self._terms(tokens, real)
        lengths = count[:, -1].tolist()
        keys = terms.sum(axis=1, dtype=np.uint64).tolist()
        width = ids.shape[1]
        for r, (length, key) in enumerate(zip(lengths, keys, strict=True)):
            if length:
                self._entries[(length, key)] = _Entry(
                    block, r, tokens[r, width - length :], self._call
                )
