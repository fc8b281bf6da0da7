"""Engine contexts for the DeepSpeed engine's tests, built as a run builds them.

The engine reads ``plugins.deepspeed`` from the run config its ``model`` node belongs to, so a
test composes a whole config from the schema (with its overrides) and hands the engine the
``actor_rollout_ref.model`` and ``actor_rollout_ref.actor`` nodes of it, exactly as the worker
does.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from polyrl.config.schema import PolyrlConfig
from polyrl.interfaces.training_engine import EngineContext


def ds_context(
    model_path: str,
    *,
    model: dict[str, Any],
    engine: dict[str, Any],
    deepspeed: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    role: str = "actor",
    seed: int = 3,
    total_training_steps: int = 4,
) -> EngineContext:
    cfg = OmegaConf.merge(
        OmegaConf.structured(PolyrlConfig),
        {
            "actor_rollout_ref": {"model": {"path": model_path, **model}, "actor": engine},
            "plugins": {"deepspeed": deepspeed},
        },
    )
    return EngineContext(
        role=role,
        model_path=model_path,
        model=cfg.actor_rollout_ref.model,
        engine=cfg.actor_rollout_ref.actor,
        device="cpu",
        rank=rank,
        world_size=world_size,
        seed=seed,
        total_training_steps=total_training_steps,
        trainable=role != "ref",
    )
