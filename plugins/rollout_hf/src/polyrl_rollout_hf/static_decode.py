"""The ``hf`` rollout's fast decode step: a static KV cache, replayed as a CUDA graph.

Why: one decode step of a small model is hundreds of small kernels, and launching them from
Python one by one costs more than running them (on an H200, a Qwen2-0.5B-shaped model decoded
at ~9k tokens/s with a dynamic cache, the same as transformers' default ``generate``). Here the
decode step's forward runs against a transformers ``StaticCache`` whose tensors never move, with
fixed-address inputs (token ids, positions, a 4D attention mask), so on CUDA it is captured once
into a ``torch.cuda.CUDAGraph`` and then replayed: one launch per step.

Shapes are bucketed so that a handful of graphs serve every call: the rows of a chunk (prompts x
n) round up to a row bucket (extra rows decode a pad token and are never sampled), and the
cache's length (prompt + new tokens) rounds up to a length bucket (slots past the current step
are masked). The prompt's length does not enter the graph: the prefill runs eagerly, once per
prompt, and its KV cache is copied ``n`` times into the static cache.

Weights: the graph reads the model's parameters at their addresses, so ``update_weights``
(an in-place ``copy_``) needs no recapture. If a parameter's storage is replaced (e.g.
``load_state_dict(assign=True)``, ``model.to(...)``), the next call notices the changed address
and captures again (counted in :attr:`StaticDecodePool.captures`).

Attention: with a mask, transformers' SDPA path repeats the grouped KV heads (``repeat_kv``) to
the number of query heads, which for Qwen2-0.5B (14 query heads, 2 KV heads) writes and reads
7x the KV cache every step. For a single query token the decode step instead folds the query
heads of each KV head into the query-length axis (``[B, H, 1, D] -> [B, KV, H/KV, D]``): the same
attention, computed by one SDPA call that reads the cache once (:func:`grouped_decode_attention`).

The sampling itself (:func:`polyrl_rollout_hf.sampling.pick_tokens`) stays outside the graph,
unchanged, so the distribution and the recorded log-probs are the eager path's.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from polyrl_rollout_hf.fused_step import FusedDecodeStep

logger = logging.getLogger(__name__)

ATTENTION_NAME = "polyrl_grouped_decode"
MIN_ROWS_BUCKET = 8
MIN_LENGTH_BUCKET = 64


def bucket(value: int, minimum: int) -> int:
    """The smallest bucket >= ``value``: ``minimum`` or one of 2^k and 3 * 2^(k-1) above it.

    Geometric buckets keep the number of distinct graphs logarithmic in the sizes seen, and the
    padding under a third of the size (e.g. 320 -> 384, 256 -> 256, 257 -> 384, 100 -> 128).
    """
    if value < 1:
        raise ValueError(f"bucket size must be at least 1, got {value}")
    size = max(int(minimum), 1)
    while size < value:
        half = 1 << (size.bit_length() - 1)  # the power of two at or below size
        size = half * 3 // 2 if size == half and half >= 2 else half * 2
    return size


SPAN_PARTS = 4


def span_sizes(length: int) -> list[int]:
    """The attention spans of a ``length``-column cache: its quarters, rounded up to 16
    columns (the alignment SDPA's kernels want of a mask)."""
    sizes = {min(length, -(-length * part // SPAN_PARTS // 16) * 16) for part in range(1, 5)}
    return sorted(sizes)


def grouped_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention for one query token per row over a grouped (GQA) KV cache.

    ``query [B, H, 1, D]``, ``key``/``value [B, KV, L, D]``, ``attention_mask [B, 1, 1, L]``
    (bool, True = attend). The ``H / KV`` query heads of each KV head become that head's query
    axis, so the cache is read once instead of being repeated to ``H`` heads. Anything else
    (a prefill, dropout, a soft cap, attention sinks, a sliding window) goes to transformers'
    own SDPA function unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    plain = (
        q_len == 1
        and dropout == 0.0
        and attention_mask is not None
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
        and attention_mask.shape[2] == 1
        and heads % kv_heads == 0
        and all(kwargs.get(k) is None for k in ("softcap", "s_aux", "sliding_window"))
        and kwargs.get("position_bias") is None
    )
    if not plain:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(batch, 1, heads, value.shape[-1]), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, grouped_decode_attention)


@contextlib.contextmanager
def decode_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run the model's attention through :func:`grouped_decode_attention` inside the block."""
    config = model.config
    before = config._attn_implementation_internal
    config._attn_implementation_internal = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation_internal = before


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot use the static decode step, or None when it can."""
    try:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer
    except ImportError as err:  # transformers 4.x
        return f"this transformers has no v5 StaticCache ({err})"
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder model"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {config._attn_implementation!r} (needs 'sdpa')"
    if not hasattr(config, "_attn_implementation_internal"):
        return "the config has no _attn_implementation_internal"
    try:
        cache = StaticCache(config=config, max_cache_len=MIN_LENGTH_BUCKET)
    except Exception as err:  # noqa: BLE001 - any model transformers' StaticCache rejects
        return f"transformers' StaticCache rejects the model ({type(err).__name__}: {err})"
    kinds = {type(layer).__name__ for layer in cache.layers}
    if kinds != {StaticLayer.__name__} or not all(
        hasattr(layer, "cumulative_length") for layer in cache.layers
    ):
        return f"cache layers {sorted(kinds)} (only full-attention StaticLayer is supported)"
    return None


def kv_shape(model: torch.nn.Module) -> tuple[int, int]:
    """(KV heads, head dim) of the model's attention."""
    config = model.config.get_text_config(decoder=True)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads, int(head_dim)


class StaticDecoder:
    """One static KV cache of ``rows`` x ``length`` slots and its decode step (a CUDA graph on
    CUDA, the same eager forward elsewhere).

    Per call: :meth:`load` copies a prefill's cache in (each prompt's KV ``n`` times), then each
    :meth:`step` feeds one token per row and returns the next logits ``[real_rows, V]``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        rows: int,
        length: int,
        pad_token_id: int,
        *,
        share: StaticDecoder | None = None,
        fused: FusedDecodeStep | None = None,
    ):
        from transformers import StaticCache

        self.model = model
        self.fused = fused
        self.rows, self.length = int(rows), int(length)
        self.pad_token_id = int(pad_token_id)
        if share is not None and (self.rows > share.rows or self.length != share.length):
            raise ValueError(
                f"a {self.rows} x {self.length} decoder cannot view a {share.rows} x "
                f"{share.length} one"
            )
        device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        kv_heads, head_dim = kv_shape(model)
        self.cache = StaticCache(config=model.config, max_cache_len=self.length)
        self.cache.early_initialization(
            batch_size=1 if share else self.rows,
            num_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )
        # One counter per layer, as views of one tensor: a single fill sets every layer's write
        # column (the graph's own increments then stay within the step).
        self.write_column = torch.zeros(len(self.cache.layers), dtype=torch.long, device=device)
        for index, layer in enumerate(self.cache.layers):
            layer.cumulative_length = self.write_column[index]
        if share is None:
            self.input_ids = torch.full((self.rows, 1), self.pad_token_id, device=device)
            self.position_ids = torch.zeros((self.rows, 1), dtype=torch.long, device=device)
            self.mask = torch.zeros((self.rows, 1, 1, self.length), dtype=torch.bool, device=device)
        else:  # the first rows of another decoder's tensors: moving rows there needs no copy out
            for layer, theirs in zip(self.cache.layers, share.cache.layers, strict=True):
                layer.keys, layer.values = theirs.keys[: self.rows], theirs.values[: self.rows]
                layer.batch_size = self.rows
            self.input_ids = share.input_ids[: self.rows]
            self.position_ids = share.position_ids[: self.rows]
            self.mask = share.mask[: self.rows]
        self.mask2d = self.mask.view(self.rows, self.length)
        # The fused step's attention kernel reads the columns before this device-side end (one
        # graph for every step). SDPA in the fused step reads only the first ``span`` columns
        # while the write column has not yet gone past them (a graph per span); the model's own
        # forward always reads all of them.
        self.read_end = torch.ones(1, dtype=torch.long, device=device)
        spans = fused is not None and not fused.attention_kernel
        self.spans = span_sizes(self.length) if spans else [self.length]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.real_rows = 0
        self.slot = 0

    # ---- one call -----------------------------------------------------------------------------
    def load(
        self, prefill_cache: Any, prompt_mask: torch.Tensor, last_positions: torch.Tensor, n: int
    ) -> None:
        """Start a call from a prefill of ``P`` prompts: ``prefill_cache`` (a DynamicCache of
        ``[P, KV, Lp, D]`` per layer), ``prompt_mask [P, Lp]`` and ``last_positions [P, 1]``
        (each prompt's last position id). Rows ``i*n .. i*n+n-1`` are prompt ``i``."""
        prompts, prompt_len = prompt_mask.shape
        real = prompts * n
        if real > self.rows or prompt_len >= self.length:
            raise ValueError(
                f"static decoder of {self.rows} rows x {self.length} slots cannot take "
                f"{real} rows with {prompt_len} prompt tokens"
            )
        for layer, source in zip(self.cache.layers, prefill_cache.layers, strict=True):
            for mine, theirs in ((layer.keys, source.keys), (layer.values, source.values)):
                mine[:real, :, :prompt_len].unflatten(0, (prompts, n)).copy_(theirs.unsqueeze(1))
        self.mask2d.zero_()
        self.mask2d[:real, :prompt_len] = prompt_mask.bool().repeat_interleave(n, dim=0)
        self.input_ids.fill_(self.pad_token_id)
        self.position_ids.zero_()
        self.position_ids[:real] = (last_positions + 1).repeat_interleave(n, dim=0)
        self.real_rows, self.slot = real, prompt_len

    def admit(
        self,
        slots: torch.Tensor,
        prefill_cache: Any,
        prompt_mask: torch.Tensor,
        last_positions: torch.Tensor,
        sources: torch.Tensor,
    ) -> None:
        """Put prefilled prompts into free ``slots`` while other rows keep decoding: slot
        ``slots[i]`` takes prefill row ``sources[i]`` (its KV ``[KV, Lp, D]`` per layer, its
        ``prompt_mask [Lp]`` and ``last_positions [1]``). The prompt fills the ``Lp`` ring slots
        just before the next write, so its first token lands right after it, and the row's own
        span (prompt + new tokens <= ``length``) is not overwritten before the row ends."""
        prompt_len = prompt_mask.shape[1]
        if prompt_len >= self.length:
            raise ValueError(f"{prompt_len} prompt tokens do not fit {self.length} cache slots")
        start = (self.slot - prompt_len) % self.length
        pieces = [(start, 0, min(prompt_len, self.length - start))]
        if pieces[0][2] < prompt_len:  # the span wraps past the last slot
            pieces.append((0, pieces[0][2], prompt_len - pieces[0][2]))
        for layer, source in zip(self.cache.layers, prefill_cache.layers, strict=True):
            for mine, theirs in ((layer.keys, source.keys), (layer.values, source.values)):
                rows = theirs.index_select(0, sources)
                for at, offset, size in pieces:
                    mine[slots, :, at : at + size] = rows[:, :, offset : offset + size]
        rows_mask = prompt_mask.bool().index_select(0, sources)
        self.mask2d[slots] = False
        for at, offset, size in pieces:
            self.mask2d[slots, at : at + size] = rows_mask[:, offset : offset + size]
        self.position_ids[slots] = last_positions.index_select(0, sources) + 1

    def move_to_front(self, keep: torch.Tensor) -> None:
        """Move rows ``keep`` (slot indices) to slots ``0 .. len(keep)-1``, in that order: a
        decoder of fewer rows viewing this one's tensors then decodes them."""
        count = keep.numel()
        for layer in self.cache.layers:
            layer.keys[:count] = layer.keys.index_select(0, keep)
            layer.values[:count] = layer.values.index_select(0, keep)
        self.mask2d[:count] = self.mask2d.index_select(0, keep)
        self.position_ids[:count] = self.position_ids.index_select(0, keep)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens [real_rows, 1]`` at the next slot; the logits ``[real_rows, V]`` after
        them (a view of the graph's output on CUDA: read it before the next step).

        Slots are a ring: past the last one the next step writes slot 0. A call that loads a
        prompt at slot 0 never wraps (the cache holds prompt + new tokens); the continuous
        batcher (:mod:`polyrl_rollout_hf.continuous`) places each row's tokens so that a row's
        own span of at most ``length`` slots is never overwritten."""
        column = self.slot % self.length
        span = self.span()
        self.input_ids[: self.real_rows].copy_(tokens)
        self.mask2d[:, column] = True  # the token written at this slot sees itself
        self.write_column.fill_(column)
        if self.fused is not None and self.fused.attention_kernel:
            self.read_end.fill_(self.length if self.slot >= self.length else self.slot + 1)
        self.slot += 1
        if self.graphs:
            with torch.cuda.device(self.input_ids.device):  # replay on the graph's GPU
                self.graphs[span].replay()
            logits = self.outputs[span]
        else:
            logits = self._forward(span)
        self.position_ids.add_(1)
        return logits[: self.real_rows, -1, :]

    def span(self) -> int:
        """The cache columns the next step must read: every column written since the last
        :meth:`load` (or the start of a continuous run) lies below ``slot`` until the write
        column wraps, and the step writes column ``slot``; after a wrap, all of them."""
        if self.slot >= self.length:
            return self.length
        return next(span for span in self.spans if span > self.slot)

    # ---- the step's forward -------------------------------------------------------------------
    def _forward(self, span: int) -> torch.Tensor:
        if self.fused is not None:
            caches = [(layer.keys, layer.values) for layer in self.cache.layers]
            column = self.write_column[:1]
            return self.fused(
                self.input_ids,
                self.position_ids,
                self.mask,
                column,
                caches,
                span=span,
                read_end=self.read_end,
            )
        with decode_attention(self.model):
            return self.model(
                input_ids=self.input_ids,
                attention_mask=self.mask,
                position_ids=self.position_ids,
                past_key_values=self.cache,
                use_cache=True,
            ).logits

    def capture(self, warmup: int = 2) -> None:
        """Record the decode step as one CUDA graph per span (after ``warmup`` eager runs on a
        side stream, as CUDA graph capture requires). The cache contents these runs write are
        dummies: :meth:`load` sets every slot a call reads. The graphs share one memory pool:
        they never run at once, and a step's logits are read before the next step runs."""
        with torch.cuda.device(self.input_ids.device):  # the engine's GPU, not the current one
            self.write_column.zero_()
            self.mask2d.zero_()
            self.mask2d[:, : warmup + 1] = True
            self.read_end.fill_(warmup + 1)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    for span in self.spans:
                        self._forward(span)
            torch.cuda.current_stream().wait_stream(stream)
            pool = torch.cuda.graph_pool_handle()
            for span in self.spans:
                self.write_column.zero_()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[span] = self._forward(span)
                self.graphs[span] = graph


class StaticDecodePool:
    """The static decoders of one model, by (row bucket, length bucket), least recently used
    first out beyond ``max_decoders``; on CUDA each is captured as a graph once.

    ``captures`` counts graph captures: a weight update (in-place copies) leaves it unchanged.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pad_token_id: int,
        *,
        use_graphs: bool,
        fused: bool = False,
        compile: bool = False,
        merge: bool = False,
        attention_kernel: bool = False,
        max_decoders: int = 4,
    ):
        _register_attention()
        self.model = model
        self.fused = (
            FusedDecodeStep(model, compile=compile, merge=merge, attention_kernel=attention_kernel)
            if fused
            else None
        )
        self.pad_token_id = int(pad_token_id)
        self.use_graphs = bool(use_graphs)
        self.max_decoders = int(max_decoders)
        self.captures = 0
        self._decoders: OrderedDict[tuple[int, int], StaticDecoder] = OrderedDict()
        self._ladders: dict[tuple[int, int], list[StaticDecoder]] = {}
        self._addresses: list[int] = []

    @staticmethod
    def buckets(rows: int, length: int) -> tuple[int, int]:
        """The (rows, cache length) bucket of a chunk of ``rows`` rows needing ``length`` slots."""
        return bucket(rows, MIN_ROWS_BUCKET), bucket(length, MIN_LENGTH_BUCKET)

    def _weight_addresses(self) -> list[int]:
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return [t.data_ptr() for t in tensors]

    def _check_weights_in_place(self) -> None:
        """Drop every graph if the model's weights moved to new storage since the captures."""
        captured = self.use_graphs and (self._decoders or self._ladders)
        if captured and self._weight_addresses() != self._addresses:
            logger.warning(
                "hf rollout: the model's weights moved to new storage since the CUDA graphs "
                "were captured; capturing them again (update_weights copies in place and "
                "does not cause this)"
            )
            self.clear()

    def _ready(self, decoder: StaticDecoder) -> StaticDecoder:
        if self.use_graphs:
            decoder.capture()
            self.captures += 1
            self._addresses = self._weight_addresses()
        return decoder

    def get(self, rows: int, length: int) -> StaticDecoder:
        """A decoder with room for ``rows`` rows and ``length`` cache slots."""
        self._check_weights_in_place()
        key = self.buckets(rows, length)
        decoder = self._decoders.get(key)
        if decoder is None:
            while len(self._decoders) >= self.max_decoders:
                self._decoders.popitem(last=False)
            decoder = self._ready(
                StaticDecoder(self.model, *key, self.pad_token_id, fused=self.fused)
            )
            self._decoders[key] = decoder
        self._decoders.move_to_end(key)
        return decoder

    def ladder(self, slots: int, length: int) -> list[StaticDecoder]:
        """Decoders of ``slots``, ``slots // 2``, ... rows (down to :data:`MIN_ROWS_BUCKET`) over
        one KV cache of ``slots`` rows x the length bucket of ``length``: each smaller one views
        the first rows of the largest, so rows moved to the front keep decoding in a cheaper
        step without a copy out. All are captured before any is used (a capture's warm-up runs
        write into the rows they share). One ladder is held at a time; a call that fits the
        held one (as many slots, a cache at least as long) uses it, so that calls of growing
        lengths, such as the turns of a multi-turn rollout, capture once, not once per length."""
        self._check_weights_in_place()
        key = (int(slots), bucket(length, MIN_LENGTH_BUCKET))
        ladder = self._ladders.get(key)
        for (held_slots, held_length), held in self._ladders.items():
            if ladder is None and held_slots == key[0] and held_length >= key[1]:
                ladder = held
        if ladder is None:
            self._ladders.clear()  # one KV cache of this size is enough memory to hold
            ladder = [StaticDecoder(self.model, *key, self.pad_token_id, fused=self.fused)]
            while ladder[-1].rows // 2 >= MIN_ROWS_BUCKET:
                ladder.append(
                    StaticDecoder(
                        self.model,
                        ladder[-1].rows // 2,
                        key[1],
                        self.pad_token_id,
                        share=ladder[0],
                        fused=self.fused,
                    )
                )
            for decoder in ladder:
                self._ready(decoder)
            self._ladders[key] = ladder
        return ladder

    def clear(self) -> None:
        self._decoders.clear()
        self._ladders.clear()
        self._addresses = []

    def __len__(self) -> int:
        return len(self._decoders)
