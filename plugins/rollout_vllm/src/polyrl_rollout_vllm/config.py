"""Mapping of the ``actor_rollout_ref.rollout`` config node (verl's key names) to vLLM engine args.

Kept apart from the engine so that it is testable without vLLM, and so that the mapping from verl's
keys to vLLM's arguments is readable in one place:

=============================================  ============================================
``actor_rollout_ref.rollout.<key>``            ``vllm.LLM(...)`` argument
=============================================  ============================================
``dtype``                                      ``dtype``
``seed``                                       ``seed`` (+ 1_000_003 x data-parallel rank)
``gpu_memory_utilization``                     ``gpu_memory_utilization`` (CUDA only, see below)
``tensor_model_parallel_size``                 ``tensor_parallel_size``
``enforce_eager``                              ``enforce_eager``
``max_num_batched_tokens``                     ``max_num_batched_tokens``
``max_num_seqs``                               ``max_num_seqs``
``enable_prefix_caching``                      ``enable_prefix_caching``
``enable_chunked_prefill``                     ``enable_chunked_prefill``
``free_cache_engine``                          ``enable_sleep_mode`` (CUDA only)
``data.max_prompt_length + max_response_len``  ``max_model_len``
``engine_kwargs`` (flat, or verl's ``.vllm``)  passed through unchanged, overriding the above
=============================================  ============================================
"""

from __future__ import annotations

from typing import Any

from polyrl.api import DTYPE_ALIASES, SEED_STRIDE, rollout_node
from polyrl.api import passthrough_engine_kwargs as core_passthrough_engine_kwargs
from polyrl_rollout_vllm.checks import (
    BACKEND_SECTIONS,
    dtype_problem,
    engine_kwargs_problem,
    tensor_parallel_problem,
)
from polyrl_rollout_vllm.errors import VLLMRolloutConfigError

# Log-probs of the sampled token after temperature and top-k/top-p: log_softmax(logits / T)
# (renormalised over the kept tokens when top-k/top-p cut the vocabulary). vLLM's default,
# "raw_logprobs", is log_softmax(logits) before temperature, which is not what the trainer
# recomputes (it divides the logits by the rollout temperature).
LOGPROBS_MODE = "processed_logprobs"

# On CPU the KV cache is sized explicitly (vLLM otherwise reserves gpu_memory_utilization x the
# machine's total RAM, which fails on a shared machine). Estimated from the config, within bounds.
CPU_KV_CACHE_MIN_BYTES = 64 << 20
CPU_KV_CACHE_MAX_BYTES = 2 << 30


def passthrough_engine_kwargs(config: Any) -> dict[str, Any]:
    """``engine_kwargs`` as vLLM arguments. verl nests them per backend
    (``engine_kwargs.vllm.<arg>``); a flat mapping is accepted too."""
    return core_passthrough_engine_kwargs(
        config,
        backend="vllm",
        sections=BACKEND_SECTIONS,
        problem=engine_kwargs_problem,
        error=VLLMRolloutConfigError,
    )


def kv_cache_bytes_estimate(
    model_path: str, max_num_seqs: int, max_model_len: int, dtype: str
) -> int:
    """KV-cache bytes for ``max_num_seqs`` full-length sequences, clamped to
    [CPU_KV_CACHE_MIN_BYTES, CPU_KV_CACHE_MAX_BYTES]. vLLM schedules fewer sequences at once when
    the cache is smaller than this, so the clamp costs throughput, never correctness."""
    import json
    import os

    with open(os.path.join(model_path, "config.json")) as fh:
        hf = json.load(fh)
    hf = hf.get("text_config", hf)
    layers = int(hf.get("num_hidden_layers", 1))
    heads = int(hf.get("num_attention_heads", 1))
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    head_dim = int(hf.get("head_dim") or int(hf.get("hidden_size", 64)) // heads)
    elem = 4 if dtype in ("float32", "float") else 2
    per_token = 2 * layers * kv_heads * head_dim * elem
    wanted = per_token * max_num_seqs * max_model_len
    return int(min(max(wanted, CPU_KV_CACHE_MIN_BYTES), CPU_KV_CACHE_MAX_BYTES))


def build_engine_args(
    config: Any,
    *,
    model_path: str,
    device: str,
    max_model_len: int,
    seed: int,
    rank: int = 0,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` from the rollout config node (see the module table).

    ``seed`` is used only when the node's ``seed`` is null (the schema's default is 0)."""
    config = rollout_node(config)
    problem = dtype_problem(config.dtype)
    if problem:
        raise VLLMRolloutConfigError(problem)
    dtype = str(config.dtype).lower()
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    tp = int(config.tensor_model_parallel_size)
    problem = tensor_parallel_problem(tp, device)
    if problem:
        raise VLLMRolloutConfigError(problem)
    on_cuda = str(device).startswith("cuda")
    max_num_seqs = int(config.max_num_seqs)
    base_seed = seed if config.seed is None else config.seed
    args: dict[str, Any] = {
        "model": model_path,
        "tokenizer": model_path,
        "dtype": dtype,
        # Each data-parallel rank its own default sampling stream (requests without a seed), as
        # the hf rollout; the tensor-parallel shards of one engine must share it.
        "seed": int(base_seed) + SEED_STRIDE * (int(rank) // tp),
        "tensor_parallel_size": tp,
        "enforce_eager": bool(config.enforce_eager),
        # vLLM requires max_num_batched_tokens >= max_model_len without chunked prefill.
        "max_num_batched_tokens": max(int(config.max_num_batched_tokens), max_model_len),
        "max_num_seqs": max_num_seqs,
        "enable_prefix_caching": bool(config.enable_prefix_caching),
        "enable_chunked_prefill": bool(config.enable_chunked_prefill),
        "max_model_len": int(max_model_len),
        "logprobs_mode": LOGPROBS_MODE,
        # Weights stream in from the trainer; a local folder only, never the hub.
        "trust_remote_code": False,
        "disable_log_stats": True,
    }
    if on_cuda:
        args["gpu_memory_utilization"] = float(config.gpu_memory_utilization)
        # Sleep mode needs vLLM's cumem allocator, which exists only on CUDA.
        args["enable_sleep_mode"] = bool(config.free_cache_engine)
        if tp > 1:
            # Hybrid engine with TP: every trainer rank hosts one TP shard of vLLM in its own
            # process, joined through the torch.distributed group that already exists (verl's way).
            args["distributed_executor_backend"] = "external_launcher"
    else:
        args["kv_cache_memory_bytes"] = kv_cache_bytes_estimate(
            model_path, max_num_seqs, max_model_len, dtype
        )
    extra = passthrough_engine_kwargs(config)
    if not on_cuda and "gpu_memory_utilization" in extra and "kv_cache_memory_bytes" not in extra:
        # An explicit fraction on CPU means "size the cache from this share of RAM": let vLLM.
        args.pop("kv_cache_memory_bytes")
    args.update(extra)
    return args
