"""The FSDP engine's own rules for a run config (``TrainingEngineSpec.config_check``).

Light on purpose (no torch): ``polyrl validate`` imports it. The rules every engine shares are
:mod:`polyrl_engine_kit.checks`; their names are still found here, with a deprecation warning.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from omegaconf import OmegaConf

from polyrl.api import Notice, lora_rank, role_world
from polyrl_engine_fsdp.plugin import ENGINE_NAMES
from polyrl_engine_kit.checks import (
    ACTOR,
    CRITIC,
    REF,
    ULYSSES,
    actor_ref_problems,
    dtype_problem,
    fsdp_size_problem,
    head_problem,
    model_heads,
    optim_problems,
    precision_problems,
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


def offload_notice(fsdp: Any, prefix: str) -> Notice | None:
    """verl offloads parameters and the optimizer separately; FSDP2's CPU offload policy moves
    parameters, gradients and the optimizer step together, so either key turns all of it on
    (:func:`polyrl_engine_kit.config.resolve_settings`). One notice says so when they differ."""
    if bool(fsdp.param_offload) == bool(fsdp.optimizer_offload):
        return None
    return Notice(
        f"{prefix}.fsdp_config.param_offload={bool(fsdp.param_offload)} with "
        f".optimizer_offload={bool(fsdp.optimizer_offload)}: FSDP2's CPU offload moves "
        f"parameters, gradients and the optimizer step together, so both are offloaded"
    )


def check_config(cfg: Any) -> list[str]:
    """The FSDP engine's rules for the composed run config (selected as the training engine),
    with :class:`~polyrl.api.Notice` lines for settings it honours in its own way.
    Core's checks already cover the micro-batch arithmetic and the optimizer's ranges. The
    reference's keys default to the actor's: a value it only inherits is reported once."""
    arr = cfg.actor_rollout_ref
    actor, ref = arr.actor, arr.ref
    problems = [p for p in [dtype_problem(arr.model)] if p]
    problems += actor_ref_problems(actor, ref, sequence_parallel=True, sum_pi_squared=True)
    problems += sequence_parallel_problems(cfg)
    for role, prefix, node in (("actor", ACTOR, actor), ("ref", REF, ref)):
        found = role_world(cfg, role)
        inherited = node.fsdp_config.fsdp_size == actor.fsdp_config.fsdp_size
        if role == "ref" and inherited and found == role_world(cfg, "actor"):
            continue
        if found is not None:
            size = fsdp_size_problem(node.fsdp_config, prefix, found[0], found[1])
            problems += [size] if size else []
    offload = offload_notice(actor.fsdp_config, ACTOR)
    problems += [offload] if offload else []
    problems += [p for p in [switch_problem(actor.fsdp_config, ACTOR)] if p]
    problems += precision_problems(actor.fsdp_config, ACTOR)
    if ref.fsdp_config != actor.fsdp_config:
        own = precision_problems(ref.fsdp_config, REF)
        inherited = precision_problems(actor.fsdp_config, REF)
        problems += [p for p in own if p not in inherited]
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
    if fsdp != actor_fsdp:
        problems += precision_problems(fsdp, f"{CRITIC}.model")
    offload = offload_notice(fsdp, f"{CRITIC}.model") if fsdp != actor_fsdp else None
    return [*problems, *([offload] if offload else [])]


def _path(model: Any) -> Any:
    """A model node's ``path``; None where it is not given yet (``???`` in a bare schema)."""
    return None if OmegaConf.is_missing(model, "path") else model.path


def sequence_parallel_problems(cfg: Any) -> list[str]:
    """Each role's Ulysses size: a divisor of its pool's ranks and of the model's heads, on
    packed rows (``use_remove_padding``, as verl requires). The reference's and the critic's
    follow the actor's unless set: an inherited value is reported once. The critic's engine
    node is the actor's (the critic role merges only its batch and optimizer keys over it), so
    a critic size of its own is refused."""
    arr = cfg.actor_rollout_ref
    actor_size = arr.actor[ULYSSES]
    policy = _path(arr.model)
    roles = [("actor", ACTOR, arr.actor, policy)]
    if arr.ref[ULYSSES] != actor_size or role_world(cfg, "ref") != role_world(cfg, "actor"):
        roles.append(("ref", REF, arr.ref, policy))
    problems = []
    if lora_rank(arr.model) and arr.ref[ULYSSES] != actor_size:
        problems.append(
            f"{REF}.{ULYSSES}={arr.ref[ULYSSES]} differs from the actor's {actor_size}: with "
            f"LoRA the reference scores on the actor's engine; leave {REF}.{ULYSSES} unset"
        )
    if str(cfg.critic.strategy) in ENGINE_NAMES:
        if cfg.critic[ULYSSES] != actor_size:
            problems.append(
                f"{CRITIC}.{ULYSSES}={cfg.critic[ULYSSES]} differs from the actor's "
                f"{actor_size}: the critic runs with the actor's Ulysses size; leave "
                f"{CRITIC}.{ULYSSES} unset"
            )
        critic_path = _path(cfg.critic.model)
        if critic_path is not None or role_world(cfg, CRITIC) != role_world(cfg, "actor"):
            roles.append((CRITIC, CRITIC, arr.actor, critic_path or policy))
    for role, prefix, node, path in roles:
        size = node[ULYSSES]
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            problems.append(f"{prefix}.{ULYSSES} must be a positive integer, got {size!r}")
            continue
        if size == 1:
            continue
        found = role_world(cfg, role)
        if found is not None and found[0] % size:
            problems.append(
                f"{prefix}.{ULYSSES}={size} does not divide the {found[1]}: each group of "
                f"{size} ranks splits one sequence; use a divisor of {found[0]}"
            )
        if not arr.model.use_remove_padding:
            problems.append(
                f"{prefix}.{ULYSSES}={size} splits packed rows: set "
                f"actor_rollout_ref.model.use_remove_padding=true"
            )
        heads = model_heads(path)
        problem = head_problem(*heads, size, prefix) if heads else None
        problems += [problem] if problem else []
    return problems
