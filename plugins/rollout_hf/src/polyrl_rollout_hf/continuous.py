"""Continuous batching for the ``hf`` rollout: a row that ends frees its decode slot at once and
the next queued sample takes it.

Why: with chunks of fixed rows (the static path), every chunk decodes until its longest row ends,
so on a length mix (a few tokens to the limit, as in reasoning RL) most of a chunk's slots decode
padding after their row has stopped, and a batch larger than the slots waits chunk by chunk. Here
every sample of one ``generate`` call waits in one queue; the slots (as many as the KV-cache
budget holds, :func:`decode_slots`) stay full while the queue lasts, and once it is empty the live
rows move to the front of the cache and decode in a step of half the rows, then a quarter, ...
(the decoders of :meth:`StaticDecodePool.ladder` view one cache, so no copy out is needed).

Outputs are what the static path computes row by row: the same prefill, the same decode step
(another row's presence changes nothing a row attends to: the mask keeps rows apart) and the same
:func:`~polyrl_rollout_hf.sampling.pick_tokens`. Greedy tokens are equal; sampled ones follow the
same distribution but not the same random stream, since rows draw in another order.

Where a row's tokens go in the cache: all slots write one shared column per step (transformers'
static cache writes one position for every row), and the columns are a ring. A row admitted when
the next write is column ``c`` has its prompt placed in the columns just before ``c``; its new
tokens follow, so its whole span (prompt + new tokens, at most the cache length) is never
overwritten while it decodes. Attention does not depend on where in the cache a key sits, only on
the mask and on the position ids (already applied to the cached keys by the rotary embedding).

With ``retain``, each row's keys and values (its prompt's real tokens and every response token but
the last, the ones fed back) are copied out of its slot once the row has ended, before anything
can overwrite them (a refill, a shrink, or the ring's write column coming round again, which a row
that went unnoticed for too long loses: it is then not kept), right-aligned as the prefix cache
(:mod:`polyrl_rollout_hf.prefix_cache`) keeps prompts: a multi-turn episode's next turn then
prefills only the observation after them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from polyrl.api import ConfigError, SamplingParams
from polyrl_rollout_hf.sampling import pick_tokens
from polyrl_rollout_hf.static_decode import StaticDecoder, kv_shape

logger = logging.getLogger(__name__)

# Bytes per vocabulary entry that one slot's sampling holds at a time: the step's logits in the
# model's dtype, their float32 copy, the log-softmax and the probabilities.
SAMPLING_BYTES_PER_VOCAB_ENTRY = 16
# A refill copies the waiting rows' KV into free slots; waiting until this share of the slots is
# free batches those copies at the price of a few idle slots.
REFILL_SHARE = 16


@dataclass
class Prefill:
    """A prefill of ``P`` prompts: their KV cache (``[P, KV, Lp, D]`` per layer), the logits
    after each prompt ``[P, V]``, the mask ``[P, Lp]`` and each prompt's last position
    ``[P, 1]``."""

    cache: Any
    logits: torch.Tensor
    mask: torch.Tensor
    last_positions: torch.Tensor


def bytes_per_slot(model: torch.nn.Module, length: int) -> int:
    """Device memory one decode slot of ``length`` cache positions takes: its keys and values
    in every layer plus its share of the sampling step's vocabulary-wide tensors."""
    config = model.config.get_text_config(decoder=True)
    kv_heads, head_dim = kv_shape(model)
    item = next(model.parameters()).element_size()
    kv = 2 * int(config.num_hidden_layers) * kv_heads * head_dim * int(length) * item
    return kv + int(config.vocab_size) * SAMPLING_BYTES_PER_VOCAB_ENTRY


def decode_slots(row_cap: int, slot_bytes: int, budget_bytes: int | None, source: str) -> int:
    """How many rows decode at once: ``row_cap`` (``micro_batch_size``), fewer when the KV-cache
    budget (``budget_bytes``, from ``source``) holds fewer slots of ``slot_bytes``."""
    if budget_bytes is None:
        return row_cap
    fit = int(budget_bytes) // slot_bytes
    if fit < 1:
        raise ConfigError(
            f"hf rollout: the KV-cache budget of {max(budget_bytes, 0) / 2**30:.2f} GiB ({source}) "
            f"holds no decode slot of {slot_bytes / 2**20:.1f} MiB; raise it, or shorten the "
            "prompts or data.max_response_length"
        )
    return min(row_cap, fit)


class ContinuousBatch:
    """One ``generate`` call's samples through the slots of ``ladder`` (largest first).

    Rows are prompt-major (prompt ``i``'s samples are rows ``i*n .. i*n+n-1``) and enter in that
    order; :meth:`run` returns tokens, response mask and log-probs ``[rows, max_new_tokens]``.

    The bookkeeping lives on the device: each slot's row (or the spare row ``rows`` when free) and
    its token count; every step writes the sampled tokens into the outputs at those places and
    frees the slots whose row ended, without the host looking. The host reads the slots back
    every ``check_every`` steps (a read-back waits for the device) to refill and shrink. Prompts
    are prefilled ahead, as many at a time as fill every slot, so a refill only copies KV rows.
    """

    def __init__(
        self,
        ladder: list[StaticDecoder],
        prefill: Callable[[torch.Tensor, torch.Tensor], Prefill],
        params: SamplingParams,
        stop_ids: list[int],
        pad: int,
        generator: torch.Generator,
        *,
        compiled: bool = False,
        check_every: int = 1,
        retain: bool = False,
    ):
        self.retain = bool(retain)
        # what retain copied out: right-aligned ids and mask [k, W] (CPU), per layer (keys,
        # values) [k, KV, W, D]
        self.retained: list[tuple[torch.Tensor, torch.Tensor, list[tuple[Any, Any]]]] = []
        self.ladder, self.prefill, self.params = ladder, prefill, params
        self.pad, self.generator, self.compiled = int(pad), generator, bool(compiled)
        self.check_every = max(1, int(check_every))
        self.decoder = ladder[0]
        self.device = self.decoder.input_ids.device
        self.stops = torch.tensor(stop_ids, dtype=torch.long, device=self.device)
        self.max_new = int(params.max_new_tokens)

    def _pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        params = self.params
        return pick_tokens(
            logits,
            greedy=params.greedy,
            temperature=float(params.temperature),
            top_k=int(params.top_k),
            top_p=float(params.top_p),
            generator=self.generator,
            compiled=self.compiled,
        )

    def run(
        self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = input_ids.shape[0] * n
        device, slots = self.device, self.decoder.rows
        self.spare = rows  # the output row free slots write to
        self.tokens = torch.full(
            (rows + 1, self.max_new), self.pad, dtype=torch.long, device=device
        )
        self.log_probs = torch.zeros((rows + 1, self.max_new), dtype=torch.float32, device=device)
        self.mask = torch.zeros((rows + 1, self.max_new), dtype=torch.long, device=device)
        self.feed = torch.full((slots, 1), self.pad, dtype=torch.long, device=device)
        self.slot_row = torch.full((slots,), rows, dtype=torch.long, device=device)
        self.slot_written = torch.zeros(slots, dtype=torch.long, device=device)
        self.input_ids, self.prompt_mask, self.n = input_ids, prompt_mask, n
        self.next_row, self.rows = 0, rows
        self.ready: Prefill | None = None
        self.ready_first = 0  # the first prompt of ``ready``
        # The first prompts end just before the column of the longest prompt's length (left
        # padding shared by every prompt is trimmed by the prefill) and their tokens follow, so
        # until the write column wraps every live column lies below it (the decoder's span).
        used = prompt_mask.any(dim=0).nonzero()
        self.decoder.slot = input_ids.shape[1] - (int(used[0]) if used.numel() else 0)
        self.decoder.real_rows = slots
        # per slot, the row it holds while retain may still copy it out: (row, the write column
        # at its admission, its prompt's real token count)
        self.held: list[tuple[int, int, int] | None] = [None] * slots
        if self.retain:  # the prompts as numpy rows (CPU), converted once
            self.prompt_ids = input_ids.cpu().numpy()
            self.prompt_lengths = prompt_mask.long().sum(dim=1).tolist()
        refill_at = max(1, slots // REFILL_SHARE)
        while True:
            row_of_slot = self.slot_row[: self.decoder.rows].tolist()  # the host's read-back
            if self.retain:
                ended = [s for s, r in enumerate(row_of_slot) if r == rows and self.held[s]]
                if ended:
                    self._retire(ended)
            free = [s for s, row in enumerate(row_of_slot) if row == rows]
            waiting = rows - self.next_row
            live = self.decoder.rows - len(free)
            if waiting and (len(free) >= min(refill_at, waiting) or live == 0):
                self._admit(free[:waiting])
                continue
            if live == 0:
                break
            if not waiting:
                self._shrink([s for s, row in enumerate(row_of_slot) if row != rows])
            for _ in range(self.check_every):
                self._step()
        return self.tokens[:rows], self.mask[:rows], self.log_probs[:rows]

    def _write(self, slots: slice | torch.Tensor, token: torch.Tensor, log_prob: torch.Tensor):
        """Record each slot's next token in its row and free the slots whose row ended (a stop
        token, or the limit); a free slot writes to the spare row."""
        row = self.slot_row[slots]
        column = self.slot_written[slots].clamp(max=self.max_new - 1)
        self.tokens[row, column] = token
        self.log_probs[row, column] = log_prob
        self.mask[row, column] = 1
        written = self.slot_written[slots] + 1
        ended = torch.isin(token, self.stops) | (written >= self.max_new)
        self.slot_written[slots] = written
        self.slot_row[slots] = torch.where(ended, self.spare, row)

    def _prefill_ahead(self) -> None:
        """Prefill the prompts of the next rows: enough to fill every slot."""
        n, first = self.n, self.next_row // self.n
        count = max(1, -(-self.decoder.rows // n))
        picked = slice(first, min(first + count, self.input_ids.shape[0]))
        self.ready = self.prefill(self.input_ids[picked], self.prompt_mask[picked])
        self.ready_first = first

    def _admit(self, free: list[int]) -> None:
        """Give the next rows a free slot each: their prompts' KV (prefilled ahead), first
        tokens sampled from the prompts' last logits."""
        ready = self.ready
        if ready is None or self.next_row // self.n >= self.ready_first + ready.logits.shape[0]:
            self._prefill_ahead()
            ready = self.ready
        last_row = (self.ready_first + ready.logits.shape[0]) * self.n  # rows this prefill holds
        take = min(len(free), last_row - self.next_row)
        rows = range(self.next_row, self.next_row + take)
        self.next_row += take
        sources = torch.tensor([r // self.n - self.ready_first for r in rows], device=self.device)
        slot_index = torch.tensor(free[:take], device=self.device)
        self.decoder.admit(slot_index, ready.cache, ready.mask, ready.last_positions, sources)
        if self.retain:
            lengths = self.prompt_lengths
            for slot, row in zip(free[:take], rows, strict=True):
                self.held[slot] = (row, self.decoder.slot, lengths[row // self.n])
        self.slot_row[slot_index] = torch.arange(rows.start, rows.stop, device=self.device)
        self.slot_written[slot_index] = 0
        token, log_prob = self._pick(ready.logits.index_select(0, sources))
        self._write(slot_index, token, log_prob)
        self.feed[slot_index, 0] = token

    def _shrink(self, keep: list[int]) -> None:
        """Once nothing waits, move the live slots ``keep`` to the front and step the smallest
        decoder of the ladder that holds them."""
        smaller = [d for d in self.ladder if len(keep) <= d.rows < self.decoder.rows]
        if not smaller:
            return
        target = min(smaller, key=lambda d: d.rows)
        keep_index = torch.tensor(keep, device=self.device)
        self.decoder.move_to_front(keep_index)
        for state in (self.feed, self.slot_row, self.slot_written):
            state[: len(keep)] = state.index_select(0, keep_index)
        self.slot_row[len(keep) :] = self.spare
        self.held = [self.held[s] for s in keep] + [None] * (len(self.held) - len(keep))
        target.slot, target.real_rows = self.decoder.slot, target.rows
        self.decoder = target

    def _retire(self, slots: list[int]) -> None:
        """Copy out the KV of the ended rows in ``slots``: prompt + response tokens but the
        last, from ring column ``admitted - prompt`` on, unless the write column has come round
        to it since (the row is then dropped)."""
        held = [self.held[s] for s in slots]
        for s in slots:
            self.held[s] = None
        length = self.decoder.length
        kept = [
            (slot, row, admitted - prompt, prompt)
            for slot, (row, admitted, prompt) in zip(slots, held, strict=True)
            if self.decoder.slot <= admitted - prompt + length  # nothing written over the span
        ]
        if not kept:
            return
        slot_of, row_of, starts, prompts = (np.array(column) for column in zip(*kept, strict=True))
        rows = torch.from_numpy(row_of).to(self.device)
        counts = self.mask.index_select(0, rows).sum(dim=1).cpu().numpy()
        responses = self.tokens.index_select(0, rows).cpu().numpy()
        # Each kept row's tokens are one run of its prompt row followed by its response: the
        # prompt's real tokens end the prompt row, and the response's fed-back tokens follow.
        prompt_width = self.prompt_ids.shape[1]
        joined = np.concatenate([self.prompt_ids[row_of // self.n], responses], axis=1)
        lengths = prompts + counts - 1
        width = int(lengths.max())
        shift = width - lengths[:, None]  # right-aligned: token j of a row in column shift + j
        real = np.arange(width) >= shift
        source = np.clip(prompt_width - prompts[:, None] + np.arange(width) - shift, 0, None)
        ids = np.where(real, np.take_along_axis(joined, source, axis=1), 0)
        # the ring column of each kept token: its row's span starts at ``start``
        columns = (starts[:, None] + np.arange(width) - shift) % length
        ids, mask = torch.from_numpy(ids), torch.from_numpy(real.astype(np.int64))
        columns = torch.from_numpy(np.where(real, columns, 0)).to(self.device)
        at = torch.from_numpy(slot_of).to(self.device).unsqueeze(1)
        # gathered as [k, W, KV, D] and kept as that tensor's [k, KV, W, D] view: the prefix
        # cache reads it by index, so a copy into the view's own layout would be a wasted pass
        layers = [
            tuple(tensor[at, :, columns].transpose(1, 2) for tensor in (layer.keys, layer.values))
            for layer in self.ladder[0].cache.layers
        ]
        self.retained.append((ids, mask, layers))

    def _step(self) -> None:
        decoder = self.decoder
        logits = decoder.step(self.feed[: decoder.rows])
        token, log_prob = self._pick(logits)
        self._write(slice(0, decoder.rows), token, log_prob)
        self.feed[: decoder.rows, 0] = token
