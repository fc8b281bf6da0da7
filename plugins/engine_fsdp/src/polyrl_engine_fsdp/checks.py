"""The FSDP engine's own rules for a run config (``TrainingEngineSpec.config_check``).

Light on purpose (no torch): ``polyrl validate`` imports it. The rules every engine shares are
:mod:`polyrl_engine_kit.checks`; their names are still found here, with a deprecation warning.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from polyrl.api import lora_rank, role_world
from polyrl_engine_fsdp.plugin import ENGINE_NAMES
from polyrl_engine_kit.checks import (
    ACTOR,
    CRITIC,
    REF,
    actor_ref_problems,
    dtype_problem,
    fsdp_size_problem,
    optim_problems,
    switch_problem,
)
from polyrl_engine_kit.moved import moved_names

__getattr__ = moved_names(
    __name__,
    "polyrl_engine_kit.checks",
    {
        "DTYPES",
        "LR_SCHEDULER_TYPES",
        "AUTO_SWITCH",
        "dtype_name",
        "scheduler_type",
        "positive_int",
        "batch_problems",
        "node_problems",
    },
)


def offload_problem(fsdp: Any, prefix: str) -> str | None:
    """FSDP2's CPU offload policy moves parameters, gradients and optimizer state together."""
    if bool(fsdp.param_offload) == bool(fsdp.optimizer_offload):
        return None
    return (
        f"{prefix}.fsdp_config.param_offload={bool(fsdp.param_offload)} and "
        f".optimizer_offload={bool(fsdp.optimizer_offload)}: FSDP2 offloads parameters, "
        f"gradients and the optimizer step to the CPU together, so either key turns all of it "
        f"on; set both to the same value"
    )


def check_config(cfg: Any) -> list[str]:
    """The FSDP engine's rules for the composed run config (selected as the training engine).
    Core's checks already cover the micro-batch arithmetic and the optimizer's ranges. The
    reference's keys default to the actor's: a value it only inherits is reported once."""
    arr = cfg.actor_rollout_ref
    actor, ref = arr.actor, arr.ref
    problems = [p for p in [dtype_problem(arr.model)] if p]
    problems += actor_ref_problems(actor, ref)
    for role, prefix, node in (("actor", ACTOR, actor), ("ref", REF, ref)):
        found = role_world(cfg, role)
        inherited = node.fsdp_config.fsdp_size == actor.fsdp_config.fsdp_size
        if role == "ref" and inherited and found == role_world(cfg, "actor"):
            continue
        if found is not None:
            size = fsdp_size_problem(node.fsdp_config, prefix, found[0], found[1])
            problems += [size] if size else []
    offload = offload_problem(actor.fsdp_config, ACTOR)
    problems += [offload] if offload else []
    problems += [p for p in [switch_problem(actor.fsdp_config, ACTOR)] if p]
    problems += [p for p in [peft_problem(arr.model)] if p]
    if str(cfg.critic.strategy) in ENGINE_NAMES:
        problems += critic_problems(cfg)
    return problems


def peft_problem(model: Any) -> str | None:
    """LoRA needs peft, which the ``lora`` extra of this package brings (located, not imported:
    this check must stay light)."""
    if lora_rank(model) == 0 or importlib.util.find_spec("peft") is not None:
        return None
    return (
        f"actor_rollout_ref.model.lora_rank={model.lora_rank} needs peft, which is not installed: "
        f"pip install 'polyrl-engine-fsdp[lora]'"
    )


def critic_problems(cfg: Any) -> list[str]:
    """The critic's optimizer and FSDP settings, when this engine runs it. Its FSDP settings
    follow the actor's unless set: an inherited value is reported once, for the actor."""
    problems = optim_problems(cfg.critic.optim, CRITIC)
    fsdp, actor_fsdp = cfg.critic.model.fsdp_config, cfg.actor_rollout_ref.actor.fsdp_config
    found = role_world(cfg, CRITIC)
    if found is not None and (fsdp != actor_fsdp or found != role_world(cfg, "actor")):
        size = fsdp_size_problem(fsdp, f"{CRITIC}.model", found[0], found[1])
        problems += [size] if size else []
    offload = offload_problem(fsdp, f"{CRITIC}.model") if fsdp != actor_fsdp else None
    return [*problems, *([offload] if offload else [])]
