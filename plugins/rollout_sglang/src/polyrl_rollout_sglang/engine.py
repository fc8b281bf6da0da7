"""The SGLang rollout engine: SGLang's offline ``sglang.Engine`` (not its HTTP server) started by
each worker, colocated with the training engine on the worker's GPU (the hybrid engine).

SGLang runs its scheduler (the model and the KV cache) in a child process of the worker, on the
worker's GPU. Generation goes in as token ids and comes back as token ids with their sampling
log-probs (:mod:`polyrl_rollout_sglang.generation`); fresh weights go in as handles to the
trainer's tensors, bucket by bucket (:mod:`polyrl_rollout_sglang.weight_sync`); between
generations the engine releases its GPU memory (``release_memory_occupation``) for the trainer.
With ``tensor_model_parallel_size > 1`` consecutive workers form one engine whose first worker,
the leader, drives it (:mod:`polyrl_rollout_sglang.tensor_parallel`).

Memory (``free_cache_engine=True`` builds the engine with SGLang's memory saver): ``sleep(1)``
releases the KV cache and keeps the weights on the GPU; ``sleep(2)`` also releases the weights,
which discards them (the next ``update_weights()`` must come before ``generate()``);
``wake_up()`` takes back what was released.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from polyrl.api import (
    Batch,
    DataError,
    DataParallelRank,
    PolyrlError,
    RolloutContext,
    RolloutEngine,
    SamplingParams,
    WeightStreamChecker,
    WeightSyncError,
    assemble_rollout,
    checkpoint_manifest,
    strip_left_padding,
)
from polyrl_rollout_sglang.checks import original_logprob_problem
from polyrl_rollout_sglang.config import bucket_bytes, build_engine_args, rollout_node
from polyrl_rollout_sglang.errors import (
    SGLangNotInstalledError,
    SGLangOutputError,
    SGLangRolloutConfigError,
)
from polyrl_rollout_sglang.generation import (
    GenerateRequest,
    build_requests,
    prompt_log_probs,
    samples_from_outputs,
)
from polyrl_rollout_sglang.tensor_parallel import (
    EngineGroup,
    TensorParallelPlacement,
    free_port,
    leader_address,
)
from polyrl_rollout_sglang.weight_sync import sync_weights

try:
    import sglang
    from sglang.srt.model_executor.model_runner import LocalSerializedTensor
    from sglang.srt.utils import MultiprocessingSerializer
except Exception as _exc:
    raise SGLangNotInstalledError(_exc) from _exc

logger = logging.getLogger(__name__)

KV_CACHE, WEIGHTS = "kv_cache", "weights"
# What sleep(level) releases; wake_up() resumes the same tags.
RELEASED_BY_LEVEL = {1: (KV_CACHE,), 2: (KV_CACHE, WEIGHTS)}


def _serialize(tensor: torch.Tensor) -> bytes:
    """A handle to ``tensor`` that SGLang's scheduler on the same GPU opens without a copy."""
    return MultiprocessingSerializer.serialize(tensor)


class SGLangRolloutEngine(RolloutEngine):
    """One worker's part of an SGLang engine; see the module docstring for the design."""

    def __init__(self, ctx: RolloutContext) -> None:
        super().__init__(ctx)
        problem = original_logprob_problem(dict(os.environ))
        if problem:
            raise SGLangRolloutConfigError(problem)
        config = rollout_node(ctx.config)
        self.max_model_len = int(ctx.max_prompt_length) + int(ctx.max_response_length)
        tp = int(config.tensor_model_parallel_size)
        self.placement = TensorParallelPlacement(int(ctx.rank), int(ctx.world_size), tp)
        self.group = EngineGroup.join(self.placement)
        leader = self.placement.is_leader
        self.engine_args = build_engine_args(
            config,
            model_path=ctx.model_path,
            max_model_len=self.max_model_len,
            seed=int(ctx.seed),
            placement=self.placement,
            dist_init_addr=self.group.broadcast(leader_address() if leader else None)
            if tp > 1
            else None,
            nccl_port=free_port() if tp == 1 else None,
        )
        self.bucket_bytes = bucket_bytes(config)
        if not leader:
            # A peer's Engine() must return once its scheduler is up instead of serving forever.
            os.environ["SGLANG_BLOCK_NONZERO_RANK_CHILDREN"] = "0"
        start = time.perf_counter()
        self.engine = sglang.Engine(**self.engine_args)
        self.start_seconds = time.perf_counter() - start
        self.sleep_enabled = bool(self.engine_args["enable_memory_saver"])
        self.released: tuple[str, ...] = ()
        # Why generate() must not run (set by sleep(2) or a failed sync), or None.
        self.weights_invalid: str | None = None
        self.manifest = checkpoint_manifest(ctx.model_path)
        self.last_sync: dict[str, float] = {}
        logger.info(
            "SGLang %s engine (node %d of %d) for %s started in %.1f s (dtype %s)",
            sglang.__version__,
            self.placement.node_rank,
            tp,
            ctx.model_path,
            self.start_seconds,
            self.engine_args["dtype"],
        )

    def data_parallel_rank(self) -> DataParallelRank:
        """The ``tp`` workers of one engine receive the same prompts (one data-parallel rank);
        the leader's output is the one gathered."""
        return self.placement.data_parallel_rank()

    # ---- generation --------------------------------------------------------------------------
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Every worker of the engine is called with the same prompts; the leader generates and
        hands its samples to the others, so all return the same batch."""
        self._require_valid_weights()
        rows = strip_left_padding(prompts["input_ids"], prompts["attention_mask"])
        longest = max(len(r) for r in rows)
        if longest + params.max_new_tokens > self.max_model_len:
            raise DataError(
                f"a prompt has {longest} tokens; with max_new_tokens={params.max_new_tokens} "
                f"that exceeds the {self.max_model_len} tokens the SGLang engine holds "
                f"(data.max_prompt_length + data.max_response_length); raise "
                f"data.max_prompt_length or filter long prompts"
            )
        request = build_requests(rows, params, self.ctx.eos_token_ids)
        if self.placement.is_leader:
            samples, failure = self._leader_generates(request)
        else:  # the leader resumes the memory of the whole engine; here only the bookkeeping
            self.wake_up()
            samples, failure = [], ""
        samples, failure = self.group.broadcast((samples, failure))
        if failure:
            raise SGLangOutputError(f"the engine's leader failed to generate: {failure}")
        return assemble_rollout(
            prompts,
            samples,
            n=params.n,
            max_new_tokens=params.max_new_tokens,
            pad_token_id=self.ctx.pad_token_id,
        )

    def _leader_generates(self, request: GenerateRequest) -> tuple[list[Any], str]:
        """The leader's samples, or ``([], why)`` when it failed: its peers wait for one or the
        other (an exception that only the leader saw would leave them waiting)."""
        try:
            self.wake_up()
            outputs = self.engine.generate(
                input_ids=request.input_ids,
                sampling_params=request.sampling_params,
                return_logprob=True,
            )
            return samples_from_outputs(outputs, len(request.input_ids)), ""
        except Exception as exc:
            if self.placement.size == 1:
                raise
            return [], f"{type(exc).__name__}: {exc}"

    def score_log_probs(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Teacher-forced log-probs ``log p(seq[t] | seq[:t])`` for ``t >= 1`` under the current
        weights at temperature 1 (SGLang's prompt log-probs), on the leader. Used to check a
        weight sync against the trainer."""
        if not self.placement.is_leader:
            raise PolyrlError(
                f"score_log_probs() runs on the engine's leader, worker {self.placement.leader}"
            )
        self._require_valid_weights()
        self.wake_up()
        tokens = [[int(t) for t in seq] for seq in sequences]
        outputs = self.engine.generate(
            input_ids=tokens,
            sampling_params={"max_new_tokens": 1, "temperature": 1.0},
            return_logprob=True,
            logprob_start_len=0,
        )
        return [
            torch.tensor(prompt_log_probs(out, seq, i))
            for i, (out, seq) in enumerate(zip(outputs, tokens))
        ]

    def _require_valid_weights(self) -> None:
        if self.weights_invalid:
            raise WeightSyncError(
                f"{self.weights_invalid}; call update_weights() with the full weights first"
            )

    # ---- weight sync -------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream ``(hf_name, full_tensor)`` pairs into the engine in buckets of at most
        ``update_weights_bucket_megabytes``, then drop the prefix cache (its KV entries came from
        the old weights). A failed or incomplete stream raises :class:`WeightSyncError` and
        blocks generation until a complete sync. Every worker of the engine streams its own
        copy of the full model."""
        leader = self.placement.is_leader
        if WEIGHTS in self.released:
            # The weights' memory must be back before they are written.
            if leader:
                self.engine.resume_memory_occupation(tags=[WEIGHTS])
            self.released = tuple(tag for tag in self.released if tag != WEIGHTS)
        checker = WeightStreamChecker(self.manifest, self.ctx.model_path)
        start = time.perf_counter()
        try:
            stats = sync_weights(
                named_tensors,
                group=self.group,
                checker=checker,
                serialize=_serialize,
                load=self._load_bucket if leader else None,
                bucket_bytes=self.bucket_bytes,
            )
        except WeightSyncError as exc:
            self.weights_invalid = (
                f"the last weight sync failed ({exc}) and may have left the weights partly updated"
            )
            raise
        finally:
            if leader:
                self.engine.flush_cache()
        incomplete = checker.incomplete(stats.tensors)
        if incomplete:
            self.weights_invalid, message = incomplete
            raise WeightSyncError(message)
        self.weights_invalid = None
        self.last_sync = {
            "tensors": float(stats.tensors),
            "bytes": float(stats.bytes),
            "seconds": time.perf_counter() - start,
        }

    def _load_bucket(self, named_handles: list[tuple[str, list[bytes]]]) -> None:
        """The leader's request for one bucket: each tensor as one handle per worker, of which
        SGLang's shard ``i`` opens the ``i``-th (its own worker's, on its own GPU)."""
        success, message = self.engine.update_weights_from_tensor(
            named_tensors=[
                (name, LocalSerializedTensor(values=handles)) for name, handles in named_handles
            ],
            flush_cache=False,
        )
        if not success:
            raise WeightSyncError(f"SGLang refused the weights: {message}")

    # ---- memory (hybrid engine) --------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """With ``free_cache_engine``: release the KV cache (level 1) or the KV cache and the
        weights (level 2: discarded, so update_weights() must come before the next generate()).
        Without it, nothing to free: returns at once. The leader releases for the whole engine."""
        if level not in RELEASED_BY_LEVEL:
            raise ValueError(
                f"sleep level must be 1 (KV cache) or 2 (KV cache and weights), got {level}"
            )
        if not self.sleep_enabled:
            return
        tags = [tag for tag in RELEASED_BY_LEVEL[level] if tag not in self.released]
        if not tags:
            return
        if self.placement.is_leader:
            self.engine.release_memory_occupation(tags=tags)
        self.released = (*self.released, *tags)
        if WEIGHTS in tags:
            self.weights_invalid = "sleep(level=2) released the SGLang weights"

    def wake_up(self) -> None:
        """Take back what :meth:`sleep` released (weights first, then the KV cache)."""
        if not self.released:
            return
        if self.placement.is_leader:
            self.engine.resume_memory_occupation(tags=list(reversed(self.released)))
        self.released = ()

    def close(self) -> None:
        """Shut the engine down. SGLang ends the worker's child processes (its scheduler), and
        the worker's process group stays as it is."""
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        self.engine = None
        try:
            engine.shutdown()
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
