"""The plugin's own config section, ``plugins.deepspeed.*`` (all optional)::

    actor_rollout_ref.actor.strategy=deepspeed plugins.deepspeed.zero_stage=3 \\
        plugins.deepspeed.offload_optimizer=true plugins.deepspeed.offload_param=true

Everything else comes from verl's keys, read exactly as the FSDP engine reads them:
``actor_rollout_ref.model.dtype`` (bf16/fp16/fp32), ``enable_gradient_checkpointing``, the
micro-batch keys and ``optim.*`` of the role's node. Light on purpose (no torch): ``polyrl
validate`` imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polyrl.api import ConfigError, plugin_settings

SECTION = "deepspeed"
ZERO_STAGES = (1, 2, 3)


@dataclass(frozen=True)
class DeepSpeedSettings:
    """``plugins.deepspeed``: what DeepSpeed partitions and where it keeps it.

    ``zero_stage``: 1 partitions the optimizer state, 2 also the gradients, 3 also the
    parameters (gathered layer by layer in each forward and backward).
    ``offload_optimizer``: optimizer state and the AdamW step live in CPU memory (ZeRO-Offload).
    ``offload_param``: parameters live in CPU memory between uses (ZeRO-3 only).
    """

    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_param: bool = False


def settings_problems(settings: DeepSpeedSettings) -> list[str]:
    """What is wrong with ``settings``, one line each, naming the key and the fix."""
    problems = []
    stage = settings.zero_stage
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        problems.append(
            f"plugins.{SECTION}.zero_stage={stage!r} is not a ZeRO stage; use 1 (optimizer "
            f"state), 2 (+ gradients) or 3 (+ parameters)"
        )
    for key in ("offload_optimizer", "offload_param"):
        value = getattr(settings, key)
        if not isinstance(value, bool):
            problems.append(f"plugins.{SECTION}.{key} must be true or false, got {value!r}")
    if settings.offload_param is True and stage != 3:
        problems.append(
            f"plugins.{SECTION}.offload_param=true needs plugins.{SECTION}.zero_stage=3 (only "
            f"ZeRO-3 partitions parameters); set zero_stage=3 or offload_param=false"
        )
    return problems


def deepspeed_settings(node: Any) -> DeepSpeedSettings:
    """``plugins.deepspeed`` of the run config that ``node`` belongs to (any node of it, e.g. the
    ``actor_rollout_ref.model`` node an engine receives); the defaults when absent. Raises
    :class:`ConfigError` with the same lines as ``polyrl validate``."""
    settings = plugin_settings(node, SECTION, DeepSpeedSettings)
    problems = settings_problems(settings)
    if problems:
        raise ConfigError("; ".join(problems))
    return settings
