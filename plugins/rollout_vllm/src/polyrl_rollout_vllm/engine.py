"""The vLLM rollout engine: ``vllm.LLM`` (the engine API, not HTTP) in the worker process.

Why in-process: the hybrid engine keeps actor and rollout in one process so that fresh weights reach
vLLM as an in-memory stream of tensors after each actor update. That needs vLLM's engine core and
its worker in this very process, hence ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set before vLLM is
imported) and the uni-process executor (or ``external_launcher`` for tensor parallelism on CUDA).

Log-probs: vLLM runs with ``logprobs_mode="processed_logprobs"``, so the returned log-prob of a
sampled token is ``log_softmax(logits / temperature)`` at that token, the quantity the trainer
recomputes (with top-k/top-p active it is renormalised over the kept tokens, i.e. the true sampling
distribution). Greedy requests report ``log_softmax(logits)``.

Memory (hybrid engine): on CUDA with ``free_cache_engine`` the engine is built with vLLM's sleep
mode; ``sleep(1)`` frees the KV cache (vLLM also offloads the weights to host memory), ``sleep(2)``
drops the weights too, ``wake_up()`` restores them. On CPU vLLM has no sleep mode: both calls do
nothing, on purpose and without errors.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

# Must precede the vLLM import: keeps the engine core and its worker in this process so that
# update_weights() can hand the model a Python iterator of tensors (no pickling, no disk).
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

import torch

from polyrl.api import (
    Batch,
    DataError,
    DataParallelRank,
    PolyrlError,
    RolloutContext,
    RolloutEngine,
    SamplingParams,
    tensor_parallel_mesh,
)
from polyrl_rollout_vllm.config import build_engine_args
from polyrl_rollout_vllm.errors import VLLMNotInstalledError
from polyrl_rollout_vllm.layout import assemble_rollout, strip_left_padding
from polyrl_rollout_vllm.weights import WeightStreamChecker, WeightSyncError, checkpoint_manifest

try:
    import vllm
    from vllm import LLM
    from vllm import SamplingParams as VLLMSamplingParams
except Exception as _exc:
    raise VLLMNotInstalledError(_exc) from _exc

logger = logging.getLogger(__name__)

VLLM_VERSION = vllm.__version__


def _reload_weights_on_worker(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Runs inside vLLM's worker (same process): load a checkpoint-format stream with the model's
    own ``load_weights`` (which maps q/k/v into qkv_proj, gate/up into gate_up_proj, skips a tied
    lm_head ...) through vLLM's in-place reload, which afterwards re-runs the per-layer weight
    processing (on CPU: re-packing the GEMM weights for oneDNN, which plain ``load_weights`` would
    leave stale)."""
    try:
        worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    except BaseException:
        # Put real tensors back on every layer (the old ones where nothing arrived), so that the
        # engine stays usable for the next, complete sync instead of holding meta tensors.
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        with set_current_vllm_config(worker.vllm_config):
            finalize_layerwise_reload(worker.model_runner.get_model(), worker.model_config)
        raise


class VLLMRolloutEngine(RolloutEngine):
    """One rank's vLLM engine; see the module docstring for the design."""

    def __init__(self, ctx: RolloutContext) -> None:
        super().__init__(ctx)
        self.on_cuda = str(ctx.device).startswith("cuda")
        self.max_model_len = int(ctx.max_prompt_length) + int(ctx.max_response_length)
        self.engine_args = build_engine_args(
            ctx.config,
            model_path=ctx.model_path,
            device=ctx.device,
            max_model_len=self.max_model_len,
            seed=int(ctx.seed),
            rank=int(ctx.rank),
        )
        # vLLM joins an existing default process group (the worker's) instead of making one; then
        # close() must leave that group alive for the trainer.
        self.owns_process_group = not torch.distributed.is_initialized()
        # vLLM reads it when the engine starts, too; set again here, since whoever imported this
        # module may have put the environment back since (a test running polyrl in its process)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        start = time.perf_counter()
        self.llm = LLM(**self.engine_args)
        self.start_seconds = time.perf_counter() - start
        self._check_in_process()
        self.sleep_enabled = self.on_cuda and bool(self.engine_args.get("enable_sleep_mode"))
        self.sleep_level = 0  # 0: awake
        # Why generate() must not run (set by sleep(2) or a failed sync), or None.
        self.weights_invalid: str | None = None
        self.manifest = checkpoint_manifest(ctx.model_path)
        self.last_sync: dict[str, float] = {}
        logger.info(
            "vLLM %s engine for %s started in %.1f s (%s, dtype %s)",
            VLLM_VERSION,
            ctx.model_path,
            self.start_seconds,
            ctx.device,
            self.engine_args["dtype"],
        )

    def data_parallel_rank(self) -> DataParallelRank:
        """With ``tensor_model_parallel_size=tp > 1`` (``external_launcher``), ranks
        ``k*tp .. k*tp+tp-1`` hold the shards of one engine: they must receive the same prompts
        (data-parallel rank ``k``) and only the first of them returns the samples."""
        tp = int(self.engine_args["tensor_parallel_size"])
        return tensor_parallel_mesh(int(self.ctx.rank), int(self.ctx.world_size), tp)

    def _check_in_process(self) -> None:
        executor = getattr(
            getattr(self.llm.llm_engine, "model_executor", None), "driver_worker", None
        )
        if executor is None:
            raise PolyrlError(
                "the vLLM engine runs in another process, so weights cannot be streamed into it; "
                "polyrl needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (set by polyrl_rollout_vllm.engine "
                "before vLLM is imported: import it before anything imports vllm)"
            )

    # ---- generation --------------------------------------------------------------------------
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError(
                f"sampling needs n >= 1 and max_new_tokens >= 1, got n={params.n}, "
                f"max_new_tokens={params.max_new_tokens}"
            )
        self._require_valid_weights()
        if self.sleep_level:
            self.wake_up()
        rows = strip_left_padding(prompts["input_ids"], prompts["attention_mask"])
        longest = max(len(r) for r in rows)
        if longest >= self.max_model_len:
            raise DataError(
                f"a prompt has {longest} tokens but the vLLM engine holds at most "
                f"{self.max_model_len} (data.max_prompt_length + data.max_response_length); "
                f"raise data.max_prompt_length or filter long prompts"
            )
        requests, sampling = self._requests(rows, params)
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        samples = [
            (list(c.token_ids), self._sampled_log_probs(c))
            for out in outputs
            for c in sorted(out.outputs, key=lambda c: c.index)
        ]
        return assemble_rollout(
            prompts,
            samples,
            n=params.n,
            max_new_tokens=params.max_new_tokens,
            pad_token_id=self.ctx.pad_token_id,
        )

    def _requests(
        self, rows: list[list[int]], params: SamplingParams
    ) -> tuple[list[dict[str, Any]], list[VLLMSamplingParams]]:
        """One request per prompt with vLLM's ``n`` fan-out. Greedy decoding must be requested
        with n=1 in vLLM, so greedy prompts are repeated ``n`` times instead. With a seed, prompt
        ``i`` gets ``seed + i*n`` (vLLM adds the sample index), so no two samples share a seed."""
        greedy = params.greedy or params.temperature <= 0.0
        stop = sorted(set(self.ctx.eos_token_ids) | set(params.stop_token_ids))
        repeat, per_request_n = (params.n, 1) if greedy else (1, params.n)
        requests: list[dict[str, Any]] = []
        sampling: list[VLLMSamplingParams] = []
        for i, tokens in enumerate(rows):
            for j in range(repeat):
                seed = None if params.seed is None else int(params.seed) + i * params.n + j
                requests.append({"prompt_token_ids": tokens})
                sampling.append(
                    VLLMSamplingParams(
                        n=per_request_n,
                        temperature=0.0 if greedy else float(params.temperature),
                        top_p=1.0 if greedy else float(params.top_p),
                        top_k=0
                        if greedy or params.top_k is None or params.top_k < 1
                        else int(params.top_k),
                        max_tokens=int(params.max_new_tokens),
                        stop_token_ids=stop,
                        seed=seed,
                        logprobs=0,  # only the sampled token's log-prob
                        detokenize=False,  # the trainer decodes; saves time here
                    )
                )
        return requests, sampling

    @staticmethod
    def _sampled_log_probs(completion: Any) -> list[float]:
        """The log-prob of each sampled token (vLLM returns ``{token_id: Logprob}`` per step)."""
        logprobs = completion.logprobs
        if logprobs is None:
            raise PolyrlError("vLLM returned no log-probs although logprobs=0 was requested")
        return [float(step[token].logprob) for token, step in zip(completion.token_ids, logprobs)]

    def score_log_probs(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Teacher-forced log-probs ``log p(seq[t] | seq[:t])`` for ``t >= 1`` under the current
        weights at temperature 1 (vLLM's prompt log-probs). Used to check a weight sync against the
        trainer, and handy to recompute rollout log-probs without sampling."""
        self._require_valid_weights()
        if self.sleep_level:
            self.wake_up()
        requests = [{"prompt_token_ids": list(map(int, seq))} for seq in sequences]
        params = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        result = []
        for seq, out in zip(requests, outputs):
            tokens = seq["prompt_token_ids"]
            steps = out.prompt_logprobs[1:]
            result.append(
                torch.tensor([float(step[t].logprob) for t, step in zip(tokens[1:], steps)])
            )
        return result

    def _require_valid_weights(self) -> None:
        if self.weights_invalid:
            raise WeightSyncError(
                f"{self.weights_invalid}; call update_weights() with the full weights first"
            )

    # ---- weight sync -------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream ``(hf_name, full_tensor)`` pairs into the model, one at a time, then drop the
        prefix cache (its KV entries were computed with the old weights). A failed or incomplete
        stream raises :class:`WeightSyncError` and blocks generation until a complete sync."""
        if self.sleep_level and self.sleep_enabled:
            # Weights must be resident (level 1 offloaded them, level 2 dropped them).
            self.llm.wake_up(tags=["weights"])
        stats = {"tensors": 0, "bytes": 0}
        checker = WeightStreamChecker(self.manifest, self.ctx.model_path)

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in named_tensors:
                if hasattr(tensor, "full_tensor"):  # a sharded DTensor: gather it first
                    tensor = tensor.full_tensor()
                checker.check(name, tensor)
                stats["tensors"] += 1
                stats["bytes"] += tensor.numel() * tensor.element_size()
                yield name, tensor

        start = time.perf_counter()
        try:
            with torch.no_grad():
                self.llm.collective_rpc(_reload_weights_on_worker, args=(counted(),))
        except Exception as exc:
            self.weights_invalid = (
                f"the last weight sync failed after {stats['tensors']} tensors "
                f"({type(exc).__name__}: {exc}) and left the weights partly updated"
            )
            if isinstance(exc, WeightSyncError):
                raise
            raise WeightSyncError(
                f"weight sync into vLLM failed: {type(exc).__name__}: {exc}. The trainer must "
                f"stream Hugging Face state-dict names and shapes of the model in "
                f"{self.ctx.model_path}"
            ) from exc
        finally:
            self.llm.reset_prefix_cache()
        incomplete = checker.incomplete(stats["tensors"])
        if incomplete:
            self.weights_invalid, message = incomplete
            raise WeightSyncError(message)
        self.weights_invalid = None
        seconds = time.perf_counter() - start
        self.last_sync = {
            "tensors": float(stats["tensors"]),
            "bytes": float(stats["bytes"]),
            "seconds": seconds,
        }

    # ---- memory (hybrid engine) --------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """CUDA with ``free_cache_engine``: vLLM sleep (1: KV cache freed, weights offloaded to
        host; 2: weights dropped too, so update_weights() must come before the next generate()).
        CPU, or ``free_cache_engine=False``: nothing to free, returns at once."""
        if level not in (1, 2):
            raise ValueError(
                f"sleep level must be 1 (KV cache) or 2 (KV cache and weights), got {level}"
            )
        if not self.sleep_enabled or self.sleep_level:
            return
        self.llm.sleep(level=level)
        self.sleep_level = level
        if level == 2:
            self.weights_invalid = "sleep(level=2) discarded the vLLM weights"

    def wake_up(self) -> None:
        """Restore what :meth:`sleep` freed (all of it: weights and KV cache)."""
        if not self.sleep_level:
            return
        self.llm.wake_up()
        self.sleep_level = 0
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Release the engine. vLLM's full shutdown (also run by a finalizer when the engine is
        garbage-collected) destroys torch's default process group; when that group belongs to the
        worker (it existed before the engine), the finalizer is detached and only vLLM's own parts
        are torn down: executor, scheduler, its model-parallel subgroups and its world group (vLLM
        0.32 internals; without them the full shutdown runs)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        client = llm.llm_engine.engine_core
        core = getattr(client, "engine_core", None)
        finalizer = getattr(client, "_finalizer", None)
        try:
            if self.owns_process_group or core is None or finalizer is None:
                client.shutdown()
            else:
                finalizer.detach()
                from vllm.distributed import destroy_model_parallel, parallel_state

                core.structured_output_manager.clear_backend()
                core.model_executor.shutdown()
                core.scheduler.shutdown()
                destroy_model_parallel()
                # vLLM's world group wraps subgroups of the worker's default group; left in
                # place, the next engine built in this process would reuse it after the worker
                # destroyed that group.
                if parallel_state._WORLD is not None:
                    parallel_state._WORLD.destroy()
                    parallel_state._WORLD = None
        finally:
            del llm, client, core
            gc.collect()
            if self.on_cuda and torch.cuda.is_available():
                torch.cuda.empty_cache()
