"""Engine contexts for the Megatron engine's tests, built as a run builds them: a whole config
composed from the schema, whose ``actor_rollout_ref.model`` and ``.actor`` nodes the engine gets."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from polyrl.config.schema import PolyrlConfig
from polyrl.interfaces.training_engine import EngineContext


def megatron_context(
    model_path: str,
    *,
    engine: dict[str, Any],
    tensor_parallel: int = 1,
    dtype: str = "bfloat16",
    rank: int = 0,
    world_size: int = 1,
    role: str = "actor",
    total_training_steps: int = 4,
) -> EngineContext:
    cfg = OmegaConf.merge(
        OmegaConf.structured(PolyrlConfig),
        {
            "actor_rollout_ref": {
                "model": {"path": model_path, "dtype": dtype},
                "actor": {
                    "strategy": "megatron",
                    "megatron": {"tensor_model_parallel_size": tensor_parallel},
                    **engine,
                },
            }
        },
    )
    return EngineContext(
        role=role,
        model_path=model_path,
        model=cfg.actor_rollout_ref.model,
        engine=cfg.actor_rollout_ref.actor,
        device="cuda",
        rank=rank,
        world_size=world_size,
        seed=3,
        total_training_steps=total_training_steps,
        trainable=role != "ref",
    )
