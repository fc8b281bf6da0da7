"""The Megatron engine's rules for a run config (``TrainingEngineSpec.config_check``).

Light on purpose (no torch, no megatron): ``polyrl validate`` imports it. The parallel sizes are
verl's keys ``actor_rollout_ref.actor.megatron.*``; the engine-neutral rules (micro-batch keys,
AdamW betas) are polyrl-engine-fsdp's pure helpers, so the engines word them alike. Core refuses
``trainer.device=cpu`` for this engine (its spec says CUDA only).
"""

from __future__ import annotations

from typing import Any

from polyrl.api import role_world
from polyrl_engine_kit.checks import DTYPES, actor_ref_problems, dtype_name, positive_int

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
MEGATRON = f"{ACTOR}.megatron"
DTYPES_SUPPORTED = ("bfloat16", "float32")


def parallel_problems(megatron: Any) -> list[str]:
    """The tensor/pipeline-parallel sizes themselves (the engine raises these too)."""
    return [
        f"{MEGATRON}.{key} must be a positive integer, got {getattr(megatron, key)!r}"
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size")
        if not positive_int(getattr(megatron, key))
    ]


def dtype_problem(model: Any) -> str | None:
    name = DTYPES.get(dtype_name(model))
    if name in DTYPES_SUPPORTED:
        return None
    return (
        f"actor_rollout_ref.model.dtype={dtype_name(model)!r}: the Megatron engine computes in "
        f"bfloat16 or float32 (float32 master weights either way); use one of those"
    )


def _world_problems(cfg: Any, tensor_parallel: int, pipeline_parallel: int) -> list[str]:
    problems = []
    model_parallel = tensor_parallel * pipeline_parallel
    seen: set[tuple[int, str]] = set()
    for role in ("actor", "ref"):
        found = role_world(cfg, role)
        if found is None or found in seen:
            continue
        seen.add(found)
        workers, where = found
        if workers % model_parallel:
            sizes = f"{MEGATRON}.tensor_model_parallel_size={tensor_parallel}"
            if pipeline_parallel > 1:
                sizes += f" x pipeline_model_parallel_size={pipeline_parallel}"
            problems.append(
                f"{sizes} does not divide the {workers} workers of the {role} ({where}); the "
                f"data-parallel size is workers / (tensor x pipeline parallel size)"
            )
    return problems


def check_config(cfg: Any) -> list[str]:
    """The Megatron engine's rules for the composed run config (selected as training engine)."""
    arr = cfg.actor_rollout_ref
    actor, ref = arr.actor, arr.ref
    problems = [p for p in [dtype_problem(arr.model)] if p]
    problems += actor_ref_problems(actor, ref)
    problems += [
        f"{ACTOR}.fsdp_config.{key}=true configures the FSDP engine; strategy=megatron keeps "
        f"weights and optimizer state on the GPU (set it to false)"
        for key in ("param_offload", "optimizer_offload")
        if bool(getattr(actor.fsdp_config, key))
    ]
    sizes = parallel_problems(actor.megatron)
    if sizes:
        return problems + sizes
    megatron = actor.megatron
    return problems + _world_problems(
        cfg,
        int(megatron.tensor_model_parallel_size),
        int(megatron.pipeline_model_parallel_size),
    )
