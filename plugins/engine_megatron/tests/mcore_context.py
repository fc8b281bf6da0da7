"""What the Megatron engine's tests share: engine contexts built as a run builds them (a whole
config composed from the schema, :func:`polyrl_engine_kit.testing.composed_context`, with
``strategy=megatron`` and the tensor- and pipeline-parallel sizes, on CUDA), and megatron-core's
parallel state for the CPU tests that build its modules."""

from __future__ import annotations

from typing import Any

import pytest

from polyrl.interfaces.training_engine import EngineContext
from polyrl_engine_kit.testing import composed_context


def megatron_context(
    model_path: str,
    *,
    engine: dict[str, Any],
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    dtype: str = "bfloat16",
    gradient_checkpointing: bool = False,
    remove_padding: bool = True,
    rank: int = 0,
    world_size: int = 1,
    role: str = "actor",
    total_training_steps: int = 4,
    megatron: dict[str, Any] | None = None,
) -> EngineContext:
    """``megatron``: more keys of ``actor_rollout_ref.actor.megatron`` (offload, overrides)."""
    actor = {
        "strategy": "megatron",
        "megatron": {
            "tensor_model_parallel_size": tensor_parallel,
            "pipeline_model_parallel_size": pipeline_parallel,
            **(megatron or {}),
        },
        **engine,
    }
    return composed_context(
        model_path,
        model={
            "dtype": dtype,
            "enable_gradient_checkpointing": gradient_checkpointing,
            "use_remove_padding": remove_padding,
        },
        actor=actor,
        device="cuda",
        rank=rank,
        world_size=world_size,
        role=role,
        total_training_steps=total_training_steps,
    )


@pytest.fixture
def one_rank_model_parallel():
    """megatron-core's parallel state on a private 1-rank gloo group (CPU)."""
    megatron = pytest.importorskip(
        "megatron.core", reason="pip install 'polyrl-engine-megatron[cpu]'"
    )
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    megatron.parallel_state.initialize_model_parallel(1, 1)
    yield
    megatron.parallel_state.destroy_model_parallel()
    if created:
        dist.destroy_process_group()
