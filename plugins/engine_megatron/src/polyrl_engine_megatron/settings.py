"""The Megatron engine's config section at verl's place, ``actor_rollout_ref.actor.megatron``
(mounted into the schema by :mod:`polyrl.config.sections`). Light on purpose (no torch or
megatron import): every composed config imports it."""

from __future__ import annotations

from dataclasses import dataclass

ACTOR_MEGATRON = "actor_rollout_ref.actor.megatron"


@dataclass
class MegatronSettings:
    """How the model is split over the workers of its pool; the data-parallel size is the rest:
    workers / (tensor x pipeline)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1


CONFIG_SECTIONS = {ACTOR_MEGATRON: MegatronSettings}
