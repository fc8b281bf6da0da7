"""Engine contexts for the DeepSpeed engine's tests, built as a run builds them.

The engine reads ``plugins.deepspeed`` from the run config its ``model`` node belongs to, so a
test composes a whole config (:func:`polyrl_engine_kit.testing.composed_context`) with the
``plugins.deepspeed`` section it wants.
"""

from __future__ import annotations

from typing import Any

from polyrl.interfaces.training_engine import EngineContext
from polyrl_engine_kit.testing import composed_context


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
    return composed_context(
        model_path,
        model=model,
        actor=engine,
        plugins={"deepspeed": deepspeed},
        rank=rank,
        world_size=world_size,
        role=role,
        seed=seed,
        total_training_steps=total_training_steps,
    )
