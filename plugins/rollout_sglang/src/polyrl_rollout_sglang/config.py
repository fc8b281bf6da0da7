"""Mapping of the ``actor_rollout_ref.rollout`` config node (verl's key names) to the keyword
arguments of ``sglang.Engine`` (SGLang's ``ServerArgs``).

Kept apart from the engine so that it is testable without SGLang, and so that the mapping from
verl's keys to SGLang's arguments is readable in one place:

=============================================  ==============================================
``actor_rollout_ref.rollout.<key>``            ``sglang.Engine(...)`` argument
=============================================  ==============================================
``dtype``                                      ``dtype``
``seed``                                       ``random_seed`` (+ 1_000_003 x dp rank)
``gpu_memory_utilization``                     ``mem_fraction_static``
``tensor_model_parallel_size``                 ``tp_size`` (one SGLang "node" per worker)
``enforce_eager``                              ``disable_cuda_graph``
``max_num_batched_tokens``                     ``max_prefill_tokens``
``max_num_seqs``                               ``max_running_requests``
``enable_prefix_caching``                      ``disable_radix_cache`` (negated)
``enable_chunked_prefill``                     ``chunked_prefill_size`` (-1 when false)
``free_cache_engine``                          ``enable_memory_saver``
``data.max_prompt_length + max_response_len``  ``context_length`` (+ 1, see below)
``engine_kwargs`` (flat, or verl's ``.sglang``)  passed through unchanged, overriding the above
=============================================  ==============================================

``update_weights_bucket_megabytes`` is not an engine argument: it sizes the requests of a weight
sync (:mod:`polyrl_rollout_sglang.weight_sync`).
"""

from __future__ import annotations

from typing import Any

from polyrl.api import DTYPE_ALIASES, SEED_STRIDE, rollout_node
from polyrl.api import passthrough_engine_kwargs as core_passthrough_engine_kwargs
from polyrl_rollout_sglang.checks import (
    BACKEND_SECTIONS,
    bucket_problem,
    dtype_problem,
    engine_kwargs_problem,
    tensor_parallel_problem,
)
from polyrl_rollout_sglang.errors import SGLangRolloutConfigError
from polyrl_rollout_sglang.tensor_parallel import TensorParallelPlacement


def passthrough_engine_kwargs(config: Any) -> dict[str, Any]:
    """``engine_kwargs`` as SGLang arguments. verl nests them per backend
    (``engine_kwargs.sglang.<arg>``); a flat mapping is accepted too."""
    return core_passthrough_engine_kwargs(
        config,
        backend="sglang",
        sections=BACKEND_SECTIONS,
        problem=engine_kwargs_problem,
        error=SGLangRolloutConfigError,
    )


def bucket_bytes(config: Any) -> int:
    """The most bytes of weights one ``update_weights_from_tensor`` request carries."""
    megabytes = rollout_node(config).update_weights_bucket_megabytes
    problem = bucket_problem(megabytes)
    if problem:
        raise SGLangRolloutConfigError(problem)
    return int(megabytes) << 20


def build_engine_args(
    config: Any,
    *,
    model_path: str,
    max_model_len: int,
    seed: int,
    placement: TensorParallelPlacement,
    dist_init_addr: str | None = None,
    nccl_port: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``sglang.Engine`` from the rollout config node (see the module
    table), for the worker at ``placement`` in its engine.

    ``seed`` is used only when the node's ``seed`` is null (the schema's default is 0). Every
    worker of one engine gets the same ``random_seed``: SGLang's tensor-parallel ranks must draw
    the same samples. ``dist_init_addr`` (``host:port`` of the engine's leader) joins the
    workers of a tensor-parallel engine; ``nccl_port`` is the free port a one-GPU engine uses
    for its own process group (SGLang would otherwise draw one at random, which collides when
    several workers of one machine start at once)."""
    config = rollout_node(config)
    problem = dtype_problem(config.dtype) or tensor_parallel_problem(
        config.tensor_model_parallel_size
    )
    if problem:
        raise SGLangRolloutConfigError(problem)
    tp = int(config.tensor_model_parallel_size)
    if tp != placement.size:
        raise SGLangRolloutConfigError(
            f"the worker was placed in an engine of {placement.size} GPUs but "
            f"actor_rollout_ref.rollout.tensor_model_parallel_size is {tp}"
        )
    dtype = str(config.dtype).lower()
    base_seed = seed if config.seed is None else config.seed
    args: dict[str, Any] = {
        "model_path": model_path,
        "dtype": DTYPE_ALIASES.get(dtype, dtype),
        "random_seed": int(base_seed) + SEED_STRIDE * placement.dp_rank,
        "mem_fraction_static": float(config.gpu_memory_utilization),
        "tp_size": tp,
        "disable_cuda_graph": bool(config.enforce_eager),
        "max_prefill_tokens": int(config.max_num_batched_tokens),
        "max_running_requests": int(config.max_num_seqs),
        "disable_radix_cache": not bool(config.enable_prefix_caching),
        # SGLang's size of one prefill chunk; -1 turns chunking off.
        **({} if config.enable_chunked_prefill else {"chunked_prefill_size": -1}),
        # release_memory_occupation/resume_memory_occupation need SGLang's memory saver.
        "enable_memory_saver": bool(config.free_cache_engine),
        # SGLang refuses a request whose prompt + max_new_tokens reaches context_length.
        "context_length": int(max_model_len) + 1,
        # Requests are token ids and answers are token ids: no tokenizer in the engine.
        "skip_tokenizer_init": True,
        # Weights stream in from the trainer; the folder is local, its code is not run.
        "trust_remote_code": False,
        "log_level": "error",
        # Each worker sees exactly one GPU (Ray): the engine's shard is on device 0.
        "base_gpu_id": 0,
    }
    if tp > 1:
        # One SGLang "node" of one GPU per worker: the leader (node 0) owns the tokenizer side.
        args.update(nnodes=tp, node_rank=placement.node_rank, dist_init_addr=dist_init_addr)
    elif nccl_port is not None:
        args["nccl_port"] = int(nccl_port)
    args.update(passthrough_engine_kwargs(config))
    return args
