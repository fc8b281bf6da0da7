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
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from polyrl.api import ConfigError, SamplingParams
from polyrl_rollout_hf.sampling import pick_tokens
from polyrl_rollout_hf.static_decode import StaticDecoder, kv_shape

logger = logging.getLogger(__name__)

# Bytes per vocabulary entry that one slot's sampling holds at a time: the step's logits in the
# model's dtype, their float32 copy, the log-softmax and the probabilities.
SAMPLING_BYTES_PER_VOCAB_ENTRY = 16
# A refill prefills the waiting prompts once; waiting until this share of the slots is free
# batches the prefills (each a full forward pass) at the price of a few idle slots.
REFILL_SHARE = 8


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
    """

    def __init__(
        self,
        ladder: list[StaticDecoder],
        prefill: Callable[[torch.Tensor, torch.Tensor], Prefill],
        params: SamplingParams,
        stop_ids: list[int],
        pad: int,
        generator: torch.Generator,
    ):
        self.ladder, self.prefill, self.params = ladder, prefill, params
        self.pad, self.generator = int(pad), generator
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
        )

    def run(
        self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = input_ids.shape[0] * n
        device, slots = self.device, self.decoder.rows
        self.tokens = torch.full((rows, self.max_new), self.pad, dtype=torch.long, device=device)
        self.log_probs = torch.zeros((rows, self.max_new), dtype=torch.float32, device=device)
        self.mask = torch.zeros((rows, self.max_new), dtype=torch.long, device=device)
        self.feed = torch.full((slots, 1), self.pad, dtype=torch.long, device=device)
        self.row_of_slot = [-1] * slots
        self.written = [0] * rows  # tokens each row has so far
        self.decoder.slot = 0
        self.decoder.real_rows = slots
        queue = deque(range(rows))
        refill_at = max(1, slots // REFILL_SHARE)
        while True:
            free = [s for s, row in enumerate(self.row_of_slot) if row < 0]
            live = self.decoder.rows - len(free)
            if queue and (len(free) >= min(refill_at, len(queue)) or live == 0):
                take = [queue.popleft() for _ in range(min(len(free), len(queue)))]
                self._admit(take, free, input_ids, prompt_mask, n)
                continue
            if live == 0:
                break
            if not queue:
                self._shrink(live)
            self._step()
        return self.tokens, self.mask, self.log_probs

    def _record(self, rows: list[int], token: torch.Tensor, log_prob: torch.Tensor) -> list[bool]:
        """Write each row's next token; which rows are done (a stop token, or the limit)."""
        index = torch.tensor(rows, device=self.device)
        column = torch.tensor([self.written[r] for r in rows], device=self.device)
        self.tokens[index, column] = token
        self.log_probs[index, column] = log_prob
        self.mask[index, column] = 1
        stopped = torch.isin(token, self.stops).tolist()  # the step's one host sync
        done = []
        for row, stop in zip(rows, stopped, strict=True):
            self.written[row] += 1
            done.append(stop or self.written[row] >= self.max_new)
        return done

    def _admit(
        self,
        rows: list[int],
        free: list[int],
        input_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        n: int,
    ) -> None:
        """Prefill the prompts of ``rows`` (each once), sample their first tokens, and give the
        rows that go on a free slot each."""
        prompts = sorted({row // n for row in rows})
        local = {prompt: i for i, prompt in enumerate(prompts)}
        picked = torch.tensor(prompts)
        prefill = self.prefill(input_ids[picked], prompt_mask[picked])
        sources = torch.tensor([local[row // n] for row in rows], device=self.device)
        token, log_prob = self._pick(prefill.logits.index_select(0, sources))
        done = self._record(rows, token, log_prob)
        going = [i for i, finished in enumerate(done) if not finished]
        if not going:
            return
        slots = free[: len(going)]
        keep = torch.tensor(going, device=self.device)
        slot_index = torch.tensor(slots, device=self.device)
        self.decoder.admit(
            slot_index, prefill.cache, prefill.mask, prefill.last_positions, sources[keep]
        )
        self.feed[slot_index, 0] = token[keep]
        for slot, i in zip(slots, going, strict=True):
            self.row_of_slot[slot] = rows[i]

    def _shrink(self, live: int) -> None:
        """Once nothing waits, move the live rows to the front and step the smallest decoder of
        the ladder that holds them."""
        smaller = [d for d in self.ladder if live <= d.rows < self.decoder.rows]
        if not smaller:
            return
        target = min(smaller, key=lambda d: d.rows)
        keep = [s for s, row in enumerate(self.row_of_slot) if row >= 0]
        keep_index = torch.tensor(keep, device=self.device)
        self.decoder.move_to_front(keep_index)
        self.feed[: len(keep)] = self.feed.index_select(0, keep_index)
        self.row_of_slot = [self.row_of_slot[s] for s in keep]
        self.row_of_slot += [-1] * (target.rows - len(keep))
        target.slot, target.real_rows = self.decoder.slot, target.rows
        self.decoder = target

    def _step(self) -> None:
        decoder = self.decoder
        logits = decoder.step(self.feed[: decoder.rows])
        live = [s for s, row in enumerate(self.row_of_slot) if row >= 0]
        slot_index = torch.tensor(live, device=self.device)
        token, log_prob = self._pick(logits.index_select(0, slot_index))
        self.feed[slot_index, 0] = token
        done = self._record([self.row_of_slot[s] for s in live], token, log_prob)
        for slot, finished in zip(live, done, strict=True):
            if finished:
                self.row_of_slot[slot] = -1
