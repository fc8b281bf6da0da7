"""The ``hf`` rollout engine: sampling with a plain transformers model and a KV cache.

Why our own loop rather than ``model.generate``: generate merges the model's saved
generation_config (which may carry top_k=50, repetition penalties ...) into every call and its
processed scores are not the log-probs the trainer computes. A short loop over the model's
forward gives full control over the distribution, records the exact sampling log-probs (see
:mod:`polyrl_rollout_hf.sampling`), and stops as soon as every row has stopped.

Two decode paths share that loop. The eager one (a ``DynamicCache`` that grows each step) is the
default on CPU. On CUDA the decode step runs against a static KV cache and is replayed as a CUDA
graph (:mod:`polyrl_rollout_hf.static_decode`), for Llama-family models through the compiled,
written-out layers of :mod:`polyrl_rollout_hf.fused_step`, and all samples of a call share the
decode slots (:mod:`polyrl_rollout_hf.continuous`). Both prefill each prompt once for its ``n``
samples and sample with the same :func:`~polyrl_rollout_hf.sampling.pick_tokens`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch

from polyrl.api import (
    Batch,
    ConfigError,
    RolloutContext,
    RolloutEngine,
    SamplingParams,
    schema_node,
)
from polyrl_rollout_hf.compile_cache import use_compile_cache
from polyrl_rollout_hf.continuous import ContinuousBatch, Prefill, bytes_per_slot, decode_slots
from polyrl_rollout_hf.decode_attention import unavailable_reason as kernel_unavailable_reason
from polyrl_rollout_hf.fused_prefill import continue_prefill
from polyrl_rollout_hf.fused_step import unsupported_reason as fused_unsupported_reason
from polyrl_rollout_hf.prefix_cache import Block, Hit, PrefixCache, right_aligned
from polyrl_rollout_hf.sampling import pick_tokens
from polyrl_rollout_hf.static_decode import (
    MIN_LENGTH_BUCKET,
    StaticDecodePool,
    bucket,
    unsupported_reason,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}
_SEED_STRIDE = 1_000_003  # separates the default sampling streams of different ranks
CUDA_DONE_CHECK_EVERY = 8
# engine_kwargs.hf.merge_projections=auto: the fused step's q/k/v and gate/up as one GEMM each
# (faster decode steps on CUDA, greedy tokens equal to the separate GEMMs'; see
# benchmarks/gpu/README.md)
MERGE_PROJECTIONS_BY_DEFAULT = True


def engine_option(config: Any, key: str, default: Any) -> Any:
    """``actor_rollout_ref.rollout.engine_kwargs.hf.<key>`` (verl nests engine options per
    backend; a flat ``engine_kwargs.<key>`` is accepted too)."""
    kwargs = config.engine_kwargs
    if not isinstance(kwargs, Mapping):
        return default
    nested = kwargs.get("hf")
    if isinstance(nested, Mapping) and nested.get(key) is not None:
        return nested.get(key)
    value = kwargs.get(key)
    return default if value is None else value


def _multi_turn(config: Any) -> bool:
    """Whether the run's rollout plays multi-turn episodes (``multi_turn.enable``)."""
    try:
        return bool(config.multi_turn.enable)
    except (AttributeError, KeyError):  # a config without verl's multi_turn group
        return False


def _tri_state(name: str, value: Any) -> bool | None:
    """``auto`` -> None, else a bool (from a bool or true/false/on/off/1/0)."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    if text in ("true", "on", "1", "yes"):
        return True
    if text in ("false", "off", "0", "no"):
        return False
    raise ConfigError(
        f"actor_rollout_ref.rollout.engine_kwargs.hf.{name}={value!r}: use auto, true or false"
    )


def torch_dtype(name: Any) -> torch.dtype:
    """``actor_rollout_ref.rollout.dtype`` as a torch dtype, with a clear error for a typo."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ConfigError(
            f"actor_rollout_ref.rollout.dtype={name!r} is not a dtype the hf rollout knows; "
            f"use one of {sorted(set(_DTYPES))}"
        )
    return _DTYPES[key]


class HFRolloutEngine(RolloutEngine):
    """One rank's transformers model in eval mode, sampling ``n`` responses per prompt.

    Config keys read from ``actor_rollout_ref.rollout``: ``dtype`` (bfloat16 by default; float32
    for exact tests), ``micro_batch_size`` (rows, i.e. prompts x n, per forward batch) and
    ``engine_kwargs.hf``: ``static_cache`` (``auto``: the static-cache decode step on CUDA, the
    eager one on CPU; ``true``/``false`` force it) and ``cuda_graphs`` (``true``: replay the
    static decode step as a CUDA graph on CUDA; ``false`` runs it eagerly, for debugging),
    ``continuous_batching`` (``auto``: on wherever the static cache is; ``true`` turns the static
    cache on too) and ``kv_cache_memory_bytes`` (vLLM's name: the decode slots' memory budget;
    unset, it is ``gpu_memory_utilization`` x the GPU's memory less what this process holds on
    CUDA, and no budget on CPU). With continuous batching ``micro_batch_size`` caps the decode
    slots (vLLM's ``max_num_seqs``) and the budget may lower it. ``fused_step`` (``auto``/
    ``true``: the static step runs the written-out decoder layers of
    :mod:`polyrl_rollout_hf.fused_step` for a Llama-family model, transformers' forward
    otherwise, and ``true`` refuses a model it cannot run; ``false``: transformers' forward) and
    ``compile`` (``true``, and ``auto`` on CUDA: the fused step, the continued prefill's layers
    and the sampling run through ``torch.compile``, cached on disk by
    :mod:`polyrl_rollout_hf.compile_cache`; ``false``, and
    ``auto`` on CPU: eager). ``merge_projections`` (``true``: the fused step computes each
    layer's q/k/v and gate/up with one GEMM each over stacked weights, the modules' parameters
    becoming views of them, and ``auto``; ``false``: separate GEMMs). ``triton_attention``
    (``auto``, and ``true``, which refuses a device or model without it: the fused step's
    attention by the Triton kernel of :mod:`polyrl_rollout_hf.decode_attention`, on CUDA;
    ``false``: SDPA).
    ``prefix_cache`` (``true``, and ``auto`` when ``multi_turn.enable``: keep the last call's
    KV, of its prompts or, with continuous batching, of its prompts and responses, so that a
    prompt extending one of them, a multi-turn episode's next turn, prefills only the new tokens,
    :mod:`polyrl_rollout_hf.prefix_cache`; it holds one call's KV between calls, until the
    episodes' last turn; ``false``, and ``auto`` for single-turn runs, whose prompts never
    extend earlier ones: prefill every prompt whole and
    keep nothing between calls; :meth:`reset_prefix_cache` drops what it keeps, which the
    multi-turn rollout calls after its episodes' last turn).
    vLLM's ``enforce_eager`` is not read: it defaults to true in verl's schema.

    :attr:`stats` counts, over the engine's life, the seconds spent in ``generate``, in
    prefills and in CUDA graph captures, the prefilled tokens (padding included) and the prompt
    tokens a prefill reused; with :attr:`timing_sync` set the prefill and capture seconds wait
    for the device (a benchmark's breakdown), otherwise they time the host only.
    """

    def __init__(self, ctx: RolloutContext) -> None:
        super().__init__(ctx)
        from transformers import AutoModelForCausalLM

        config = schema_node(ctx.config, "actor_rollout_ref.rollout")
        self.device = torch.device(ctx.device)
        self.dtype = torch_dtype(config.dtype)
        self.micro_batch_size = int(config.micro_batch_size)
        if self.micro_batch_size < 1:
            raise ConfigError(
                f"actor_rollout_ref.rollout.micro_batch_size={self.micro_batch_size}: "
                "must be at least 1 (rows per generation batch)"
            )
        try:
            model = AutoModelForCausalLM.from_pretrained(ctx.model_path, dtype=self.dtype)
        except OSError as err:
            raise ConfigError(
                f"the hf rollout could not load a model from {ctx.model_path!r}: {err}"
            ) from err
        self.model = model.to(self.device).eval()
        self.model.requires_grad_(False)
        self._accepts_logits_to_keep = (
            "logits_to_keep" in inspect.signature(self.model.forward).parameters
        )
        eos = list(ctx.eos_token_ids)
        if not eos:  # fall back to the model's own end-of-sequence ids
            config_eos = self.model.generation_config.eos_token_id
            if config_eos is None:
                config_eos = self.model.config.eos_token_id
            eos = [config_eos] if isinstance(config_eos, int) else list(config_eos or [])
        self.eos_token_ids = [int(t) for t in eos]
        self._generator = self._new_generator(ctx.seed + _SEED_STRIDE * ctx.rank)
        self.static_decode: StaticDecodePool | None = None
        wanted = _tri_state("static_cache", engine_option(config, "static_cache", "auto"))
        graphs = _tri_state("cuda_graphs", engine_option(config, "cuda_graphs", True))
        continuous = _tri_state(
            "continuous_batching", engine_option(config, "continuous_batching", "auto")
        )
        if wanted is None:
            wanted = self.device.type == "cuda" or continuous is True
        self.continuous = continuous is not False
        self.kv_budget_bytes = _budget_bytes(engine_option(config, "kv_cache_memory_bytes", None))
        self.gpu_memory_utilization = float(getattr(config, "gpu_memory_utilization", 0.5))
        self._slots_by_length: dict[int, int] = {}
        prefix = _tri_state("prefix_cache", engine_option(config, "prefix_cache", "auto"))
        if prefix is None:  # only a multi-turn rollout sends prompts that extend earlier ones
            prefix = _multi_turn(config)
        self.prefix_cache: PrefixCache | None = PrefixCache() if prefix else None
        self.stats: Counter[str] = Counter()
        self.timing_sync = False
        fused = _tri_state("fused_step", engine_option(config, "fused_step", "auto"))
        compiled = _tri_state("compile", engine_option(config, "compile", "auto"))
        merge = _tri_state("merge_projections", engine_option(config, "merge_projections", "auto"))
        kernel = _tri_state("triton_attention", engine_option(config, "triton_attention", "auto"))
        # auto: the fused step wherever the model allows it; compiled on CUDA only, where it
        # removes the per-layer launch overhead that dominates a decode step (the CPU would pay
        # the compilation and gain little)
        self.compiled = compiled is True or (compiled is None and self.device.type == "cuda")
        # How often the decode loops read back which rows ended: a read-back makes the host wait
        # for the GPU; steps after a row ended change no output (only how far the sampling
        # generator has advanced, so the CPU, where a read-back is free, checks every step).
        self.done_check_every = CUDA_DONE_CHECK_EVERY if self.device.type == "cuda" else 1
        if self.compiled:
            use_compile_cache()
        kernel_reason = kernel_unavailable_reason(self.device)
        if kernel is True and not wanted:
            kernel_reason = kernel_reason or "the static KV cache is off"
        if wanted:
            reason = unsupported_reason(self.model)
            if reason is None:
                fused_reason = fused_unsupported_reason(self.model)
                if fused is True and fused_reason is not None:
                    raise ConfigError(
                        "actor_rollout_ref.rollout.engine_kwargs.hf.fused_step=true, but the "
                        f"fused decode step cannot run this model: {fused_reason}; use auto"
                    )
                use_fused = fused is not False and fused_reason is None
                if kernel is True and not use_fused:
                    kernel_reason = kernel_reason or "the fused decode step is off for this model"
                self.static_decode = StaticDecodePool(
                    self.model,
                    int(ctx.pad_token_id),
                    use_graphs=self.device.type == "cuda" and graphs is not False,
                    fused=use_fused,
                    compile=self.compiled,
                    merge=merge is True or (merge is None and MERGE_PROJECTIONS_BY_DEFAULT),
                    attention_kernel=kernel is not False and kernel_reason is None,
                )
            else:
                logger.warning("hf rollout: eager decode loop, no static KV cache: %s", reason)
                kernel_reason = kernel_reason or "the static KV cache cannot run this model"
        if kernel is True and kernel_reason is not None:
            raise ConfigError(
                "actor_rollout_ref.rollout.engine_kwargs.hf.triton_attention=true, but "
                f"{kernel_reason}; use auto"
            )

    # ---- generation ---------------------------------------------------------------------------
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        _check_params(params)
        began = time.perf_counter()
        if self.prefix_cache is not None:
            self.prefix_cache.begin_call()
        try:
            return self._generate(prompts, params)
        finally:
            if self.prefix_cache is not None:
                self.prefix_cache.end_call()
            self.stats["generate_s"] += time.perf_counter() - began
            self.stats["generate_calls"] += 1

    def _generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        input_ids = prompts["input_ids"]
        if "attention_mask" in prompts:
            prompt_mask = prompts["attention_mask"]
        else:
            prompt_mask = (input_ids != self.ctx.pad_token_id).long()
        if input_ids.dim() != 2 or prompt_mask.shape != input_ids.shape:
            raise ValueError(
                "prompts need input_ids and attention_mask of one shape [batch, prompt_len]; got "
                f"{tuple(input_ids.shape)} and {tuple(prompt_mask.shape)}"
            )
        n = int(params.n)
        rows_ids = input_ids.repeat_interleave(n, dim=0)
        rows_mask = prompt_mask.repeat_interleave(n, dim=0)
        stop_ids = sorted({*self.eos_token_ids, *(int(t) for t in params.stop_token_ids)})
        generator = (
            self._new_generator(int(params.seed)) if params.seed is not None else self._generator
        )

        if self.continuous and self.static_decode is not None:
            everything = (input_ids, prompt_mask, n, params, stop_ids, generator)
            chunks = [self._sample_continuous(*everything)]
        else:
            # Chunks hold whole prompts (all n samples of each): every prompt is prefilled once.
            prompts_per_chunk = max(1, self.micro_batch_size // n)
            chunks = [
                self._sample(
                    input_ids[start : start + prompts_per_chunk],
                    prompt_mask[start : start + prompts_per_chunk],
                    n,
                    params,
                    stop_ids,
                    generator,
                )
                for start in range(0, input_ids.shape[0], prompts_per_chunk)
            ]
        responses, masks, log_probs = zip(*chunks, strict=True)
        responses_t = torch.cat(responses).cpu()
        response_mask = torch.cat(masks).cpu().to(prompt_mask.dtype)
        attention_mask = torch.cat([rows_mask.cpu(), response_mask], dim=1)
        out = Batch(
            {
                "prompts": rows_ids.cpu(),
                "responses": responses_t,
                "response_mask": response_mask,
                "rollout_log_probs": torch.cat(log_probs).cpu(),
                "input_ids": torch.cat([rows_ids.cpu(), responses_t], dim=1),
                "attention_mask": attention_mask,
                "position_ids": (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0),
            },
            {key: value for key, value in prompts.repeat_interleave(n).non_tensors.items()},
            dict(prompts.meta),
        )
        return out

    def _sync(self) -> None:
        if self.timing_sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, *, keep: bool = True) -> Prefill:
        """One forward pass over prompts ``ids``/``mask [P, Lp]`` into a DynamicCache, trimmed of
        the columns that are left padding in every row (they cost compute and change nothing).
        A prompt that starts with one the prefix cache kept prefills only the tokens after it;
        with ``keep`` the prefix cache keeps this prefill too (a call that keeps its rows' KV
        from the decode slots, prompt and response, has no use for the prompts' alone)."""
        self._sync()
        began = time.perf_counter()
        used = mask.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else 0
        ids, mask = ids[:, first:].cpu(), mask[:, first:].long().cpu()
        # the cache lays prompts out right-aligned: a mask with holes is prefilled whole
        cached = self.prefix_cache is not None and right_aligned(mask)
        hits = self.prefix_cache.lookup(ids, mask) if cached else []
        device_ids, device_mask = ids.to(self.device), mask.to(self.device)
        if any(hits):
            prefill = self._continue_prefill(device_ids, device_mask, mask.sum(dim=1), hits)
        else:
            prefill = self._fresh_prefill(device_ids, device_mask)
            self.stats["prefill_tokens"] += ids.numel()
        if cached and keep:
            layers = [(layer.keys, layer.values) for layer in prefill.cache.layers]
            self.prefix_cache.store(ids, mask, Block(layers))
        self._sync()
        self.stats["prefill_s"] += time.perf_counter() - began
        return prefill

    def _forward_prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """The model over ``ids`` after what ``cache`` holds; the logits after the last column.

        The last column is asked for by index, not by count: a count makes the model slice its
        hidden states to a ``[rows, 1, hidden]`` view that ``linear`` cannot flatten, and the
        output projection then runs as one matrix-vector product per row, each reading the
        whole vocabulary's weights."""
        last = torch.tensor([ids.shape[1] - 1], device=ids.device)
        extra = {"logits_to_keep": last} if self._accepts_logits_to_keep else {}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **extra,
        )
        return out.logits[:, -1, :]

    def _fresh_prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> Prefill:
        from transformers import DynamicCache

        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self._forward_prefill(ids, mask, positions, cache)
        return Prefill(cache, logits, mask, positions[:, -1:])

    def _continue_prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor, hits: list[Hit | None]
    ) -> Prefill:
        """The prefill of prompts ``ids``/``mask [P, W]`` (on the device; ``lengths [P]`` real
        tokens, on the CPU) where ``hits[i]`` holds the KV of prompt ``i``'s first tokens.

        The cache has a fresh prefill's layout from the start (each prompt's tokens in the last
        columns of ``W``): the kept KV is placed there, and the last ``suffix`` columns (every
        prompt's new tokens, and for a prompt with fewer new tokens some kept ones, computed
        again) run through the model after it and fill the rest. For a Llama-family model the
        layers run written out (:func:`~polyrl_rollout_hf.fused_prefill.continue_prefill`),
        otherwise through the model's forward."""
        from transformers import DynamicCache

        rows, width = ids.shape
        reused = torch.tensor([hit.length if hit else 0 for hit in hits])
        suffix = int((lengths - reused).max())
        layers = self._kept_kv(hits, lengths, width)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        fused = self.static_decode.fused if self.static_decode is not None else None
        cache = DynamicCache(config=self.model.config)
        new_ids, new_positions = ids[:, width - suffix :], positions[:, width - suffix :]
        if fused is not None:
            logits = continue_prefill(fused, new_ids, new_positions, mask, layers)
            for index, (keys, values) in enumerate(layers):
                cache.update(keys, values, index)
        else:
            for index, (keys, values) in enumerate(layers):
                cache.update(keys[:, :, : width - suffix], values[:, :, : width - suffix], index)
            logits = self._forward_prefill(new_ids, mask, new_positions, cache)
        self.stats["prefill_tokens"] += rows * suffix
        self.stats["prefix_tokens_reused"] += int(reused.sum())
        return Prefill(cache, logits, mask, positions[:, -1:])

    def _kept_kv(
        self, hits: list[Hit | None], lengths: torch.Tensor, width: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, keys and values ``[rows, KV, width, D]`` holding each hit's KV where a
        fresh prefill of its row would have it: a row of ``length`` real tokens has token ``j``
        in column ``width - length + j`` (a kept block holds its rows right-aligned too, token
        ``j`` of a kept row of ``reused`` tokens in column ``block.width - reused + j``). The
        other columns hold other kept columns (every column of a row with a hit is written, so
        the tensors start unset when every row has one) or, for a row without a hit, zeros,
        which the mask hides or the caller overwrites."""
        by_block: dict[int, tuple[Block, list[int], list[int], list[int]]] = {}
        for row, hit in enumerate(hits):
            if hit is not None:
                group = by_block.setdefault(id(hit.block), (hit.block, [], [], []))
                group[1].append(row)
                group[2].append(hit.row)
                # column c of the row reads block column c - shift
                group[3].append(width - int(lengths[row]) - (hit.block.width - hit.length))
        moves = []
        for block, targets, sources, shifts in by_block.values():
            columns = torch.arange(width) - torch.tensor(shifts).unsqueeze(1)
            moves.append(
                (
                    block,
                    torch.tensor(targets, device=self.device),
                    torch.tensor(sources, device=self.device).unsqueeze(1),
                    columns.clamp(0, block.width - 1).to(self.device),
                )
            )
        every_row = all(hit is not None for hit in hits)
        layers = []
        for index, (keys, _values) in enumerate(moves[0][0].layers):
            shape = (len(hits), keys.shape[1], width, keys.shape[3])
            start = keys.new_empty if every_row else keys.new_zeros
            kept = [start(shape), start(shape)]
            for block, targets, sources, columns in moves:
                for which in (0, 1):
                    # [k, width, KV, D] -> [k, KV, width, D]
                    taken = block.layers[index][which][sources, :, columns]
                    kept[which][targets] = taken.transpose(1, 2)
            layers.append((kept[0], kept[1]))
        return layers

    @torch.inference_mode()
    def _sample(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        n: int,
        params: SamplingParams,
        stop_ids: list[int],
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Responses, response masks and log-probs ``[prompts * n, max_new_tokens]`` for one
        chunk of prompts. Each prompt is prefilled once; its KV cache and last logits are then
        repeated for its ``n`` samples (the prefill is most of the work for short responses)."""
        rows, max_new = ids.shape[0] * n, int(params.max_new_tokens)
        prefill = self._prefill(ids, mask)
        logits = prefill.logits
        if n > 1:
            logits = logits.repeat_interleave(n, dim=0)
        if max_new == 1:
            step_fn = None
        elif self.static_decode is not None:
            length = prefill.mask.shape[1] + max_new
            decoder = self._captured(lambda: self.static_decode.get(rows, length))
            decoder.load(prefill.cache, prefill.mask, prefill.last_positions, n)
            step_fn = decoder.step
        else:
            positions = (prefill.mask.cumsum(dim=1) - 1).clamp(min=0)
            step_fn = self._eager_step(prefill.cache, prefill.mask, positions, n)
        del prefill
        pad = int(self.ctx.pad_token_id)
        return decode_loop(
            logits,
            step_fn,
            max_new,
            params,
            stop_ids,
            pad,
            generator,
            compiled=self.compiled,
            check_every=self.done_check_every,
        )

    @torch.inference_mode()
    def _sample_continuous(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        n: int,
        params: SamplingParams,
        stop_ids: list[int],
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every sample of the call through the decode slots
        (:mod:`polyrl_rollout_hf.continuous`)."""
        used = mask.any(dim=0).nonzero()
        prompt_len = ids.shape[1] - (int(used[0]) if used.numel() else 0)
        length = bucket(prompt_len + int(params.max_new_tokens), MIN_LENGTH_BUCKET)
        slots = self._decode_slots(length)
        ladder = self._captured(lambda: self.static_decode.ladder(slots, length))
        retain = self.prefix_cache is not None and right_aligned(mask)
        batch = ContinuousBatch(
            ladder,
            functools.partial(self._prefill, keep=not retain),
            params,
            stop_ids,
            int(self.ctx.pad_token_id),
            generator,
            compiled=self.compiled,
            check_every=self.done_check_every,
            retain=retain,
        )
        out = batch.run(ids, mask, n)
        for kept_ids, kept_mask, layers in batch.retained:
            self.prefix_cache.store(kept_ids, kept_mask, Block(layers))
            self.stats["decode_rows_kept"] += kept_ids.shape[0]
        return out

    def _captured(self, get: Callable[[], T]) -> T:
        """``get()`` of the static decoders, the graph captures it made counted in :attr:`stats`."""
        self._sync()
        began, captures = time.perf_counter(), self.static_decode.captures
        got = get()
        if self.static_decode.captures != captures:
            self._sync()
            self.stats["capture_s"] += time.perf_counter() - began
            self.stats["captures"] += self.static_decode.captures - captures
        return got

    def _decode_slots(self, length: int) -> int:
        """The decode slots for a cache of ``length`` positions, fixed at the first call of that
        length (so that later calls reuse its CUDA graphs)."""
        if length not in self._slots_by_length:
            slot_bytes = bytes_per_slot(self.model, length)
            budget, source = self.kv_budget_bytes, "engine_kwargs.hf.kv_cache_memory_bytes"
            if budget is None and self.device.type == "cuda":
                total = torch.cuda.get_device_properties(self.device).total_memory
                held = torch.cuda.memory_allocated(self.device)
                budget = int(self.gpu_memory_utilization * total) - held
                source = (
                    f"actor_rollout_ref.rollout.gpu_memory_utilization={self.gpu_memory_utilization}"
                    f" of {total / 2**30:.0f} GiB less {held / 2**30:.1f} GiB held"
                )
            slots = decode_slots(self.micro_batch_size, slot_bytes, budget, source)
            if slots < self.micro_batch_size:
                logger.info(
                    "hf rollout: %d decode slots of %d positions (the KV budget: %s)",
                    slots,
                    length,
                    source,
                )
            self._slots_by_length[length] = slots
        return self._slots_by_length[length]

    def _eager_step(
        self, cache: Any, mask: torch.Tensor, positions: torch.Tensor, n: int
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The DynamicCache decode step: feed ``tokens [rows, 1]``, get the next logits."""
        if n > 1:
            cache.batch_repeat_interleave(n)
            mask = mask.repeat_interleave(n, dim=0)
            positions = positions.repeat_interleave(n, dim=0)
        state = {"mask": mask, "position": positions[:, -1:] + 1}

        def step(tokens: torch.Tensor) -> torch.Tensor:
            mask = state["mask"]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            out = self.model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=state["position"],
                past_key_values=cache,
                use_cache=True,
            )
            state["mask"], state["position"] = mask, state["position"] + 1
            return out.logits[:, -1, :]

        return step

    def _new_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(int(seed) % (2**63))

    # ---- weights ------------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy each ``(hf_name, tensor)`` into the model's parameter or buffer of that name.

        Names are the model's ``state_dict`` keys (what ``save_pretrained`` writes). Tied weights
        (``lm_head.weight`` and the input embedding) share storage, so either name updates both.
        Tensors are cast to the engine's dtype and device; a DTensor is gathered first.
        """
        state = self.model.state_dict()
        for name, tensor in named_tensors:
            target = state.get(name)
            if target is None:
                valid = list(state)
                raise ConfigError(
                    f"weight sync: the rollout model has no tensor named {name!r}; it has "
                    f"{len(valid)} tensors such as {valid[:4]}. The trainer must send Hugging Face "
                    "state_dict names of the same architecture as actor_rollout_ref.model.path"
                )
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            if tuple(tensor.shape) != tuple(target.shape):
                raise ConfigError(
                    f"weight sync: {name!r} has shape {tuple(tensor.shape)} from the trainer but "
                    f"{tuple(target.shape)} in the rollout model; both must load the same model"
                )
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        if self.prefix_cache is not None:  # computed with the old weights
            self.prefix_cache.clear()

    def reset_prefix_cache(self) -> None:
        """Drop the KV the prefix cache keeps (the multi-turn rollout calls this after its
        episodes' last turn, so the memory is free through the update); a no-op without one."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def close(self) -> None:
        """Drop the model, its static caches and CUDA graphs (and the CUDA cache they used)."""
        if self.static_decode is not None:
            self.static_decode.clear()
            self.static_decode = None
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def decode_loop(
    logits: torch.Tensor,
    step: Callable[[torch.Tensor], torch.Tensor] | None,
    max_new: int,
    params: SamplingParams,
    stop_ids: list[int],
    pad: int,
    generator: torch.Generator,
    *,
    compiled: bool = False,
    check_every: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample ``max_new`` tokens per row from the first ``logits [rows, V]`` and ``step``
    (tokens ``[rows, 1]`` in, next logits out). A row stops after a stop token: from then on it
    emits ``pad`` with mask 0 and log-prob 0; the loop ends once every row has stopped, which it
    reads back every ``check_every`` steps."""
    rows, device = logits.shape[0], logits.device
    stops = torch.tensor(stop_ids, device=device, dtype=torch.long)
    tokens = torch.full((rows, max_new), pad, dtype=torch.long, device=device)
    log_probs = torch.zeros((rows, max_new), dtype=torch.float32, device=device)
    response_mask = torch.zeros((rows, max_new), dtype=torch.long, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    for index in range(max_new):
        token, log_prob = pick_tokens(
            logits,
            greedy=params.greedy,
            temperature=float(params.temperature),
            top_k=int(params.top_k),
            top_p=float(params.top_p),
            generator=generator,
            compiled=compiled,
        )
        live = ~done
        tokens[:, index] = torch.where(live, token, pad)
        log_probs[:, index] = torch.where(live, log_prob, 0.0)
        response_mask[:, index] = live.long()
        done = done | (live & torch.isin(token, stops))
        checked = (index + 1) % check_every == 0
        if index == max_new - 1 or (checked and bool(done.all())):
            break
        logits = step(tokens[:, index : index + 1])
    return tokens, response_mask, log_probs


def _budget_bytes(value: Any) -> int | None:
    """``engine_kwargs.hf.kv_cache_memory_bytes``: unset (None), or a positive byte count."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or isinstance(value, bool):
        raise ConfigError(
            f"actor_rollout_ref.rollout.engine_kwargs.hf.kv_cache_memory_bytes={value!r}: give "
            "the decode slots' memory budget in bytes (e.g. 4000000000), or leave it unset"
        )
    return number


def _check_params(params: SamplingParams) -> None:
    """Reject sampling parameters that would silently do something else."""
    problems = []
    if int(params.n) < 1:
        problems.append(f"n={params.n} (must be >= 1)")
    if int(params.max_new_tokens) < 1:
        problems.append(f"max_new_tokens={params.max_new_tokens} (must be >= 1)")
    if float(params.temperature) < 0:
        problems.append(f"temperature={params.temperature} (must be >= 0; 0 means greedy)")
    if not 0.0 < float(params.top_p) <= 1.0:
        problems.append(f"top_p={params.top_p} (must be in (0, 1])")
    if int(params.top_k) < -1:
        problems.append(f"top_k={params.top_k} (use -1 or 0 for no top-k)")
    if problems:
        raise ConfigError("hf rollout: invalid sampling parameters: " + "; ".join(problems))
