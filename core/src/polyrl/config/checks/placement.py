"""Placement: which resource pool each worker role runs in and how many workers each pool has.

Roles not placed otherwise share the global pool of ``trainer.nnodes x trainer.n_gpus_per_node``
workers, colocated (verl's hybrid engine, ``actor_rollout_ref.hybrid_engine=true``).
``actor_rollout_ref.hybrid_engine=false`` puts the rollout in a pool of its own, named
``rollout``, of ``actor_rollout_ref.rollout.nnodes x actor_rollout_ref.rollout.n_gpus_per_node``
workers (split placement: weights then travel between pools, :mod:`polyrl.workers.weight_sync`).
Any role can also be placed by name (``trainer.role_pools``: role -> pool) in a pool sized by
``trainer.resource_pools``. :func:`pool_of` and :func:`pool_size` are the one place these rules
live: the validator, the plugins' checks (:func:`role_world`) and the worker start-up
(:func:`polyrl.workers.placement.plan_pools`) all ask them.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from polyrl.config.checks.checker import Checker, get, is_positive_int

if TYPE_CHECKING:
    from polyrl.step.pipeline import StepPipeline

GLOBAL_POOL = "global"
IN_PROCESS = "in_process"  # trainer.worker_backend without Ray
ROLLOUT_POOL = "rollout"
_ROLLOUT = "actor_rollout_ref.rollout"
_SPLIT = "actor_rollout_ref.hybrid_engine=false"


def _mapping(cfg: Any, key: str) -> dict[str, Any]:
    value = get(cfg, key)
    return value if isinstance(value, dict) else {}


def is_split(cfg: Any) -> bool:
    """Whether ``actor_rollout_ref.hybrid_engine=false`` gives the rollout a pool of its own."""
    return get(cfg, "actor_rollout_ref.hybrid_engine") is False


def pool_of(cfg: Any, role: str) -> str:
    """The pool ``role`` runs in: the ``rollout`` pool for the rollout of a split placement, else
    its entry of ``trainer.role_pools``, else the global pool."""
    if role == "rollout" and is_split(cfg):
        return ROLLOUT_POOL
    return str(_mapping(cfg, "trainer.role_pools").get(role, GLOBAL_POOL))


def sized_by_nodes(cfg: Any, pool: str) -> str | None:
    """The group whose ``nnodes x n_gpus_per_node`` sizes ``pool`` (None: trainer.resource_pools
    sizes it)."""
    if pool == GLOBAL_POOL:
        return "trainer"
    if pool == ROLLOUT_POOL and is_split(cfg):
        return _ROLLOUT
    return None


def pool_size(cfg: Any, pool: str) -> tuple[Any, str]:
    """``(size, where)`` of ``pool`` as configured (None: the config does not size it, or its
    node keys are unusable), ``where`` naming the keys that size it."""
    prefix = sized_by_nodes(cfg, pool)
    if prefix is None:
        size = _mapping(cfg, "trainer.resource_pools").get(pool)
        return size, f"pool {pool!r} (trainer.resource_pools.{pool})"
    nnodes, per_node = get(cfg, f"{prefix}.nnodes"), get(cfg, f"{prefix}.n_gpus_per_node")
    where = f"{prefix}.nnodes {nnodes} x {prefix}.n_gpus_per_node {per_node}"
    if not (is_positive_int(nnodes) and is_positive_int(per_node)):
        return None, where
    return nnodes * per_node, where


def role_world(cfg: Any, role: str) -> tuple[int, str] | None:
    """``(workers, description)`` of the pool ``role`` runs in, e.g. ``(8, "world size 8 =
    trainer.nnodes 2 x trainer.n_gpus_per_node 4")``; None when the sizes are unusable (the
    range and placement checks report why)."""
    pool = pool_of(cfg, role)
    size, where = pool_size(cfg, pool)
    if not is_positive_int(size):
        return None
    joint = "=" if sized_by_nodes(cfg, pool) else "of"
    return size, f"world size {size} {joint} {where}"


def check_placement(checker: Checker, pipeline: StepPipeline | None) -> None:
    """Pools have sizes, placed roles are roles of the step, a split placement is consistent.
    ``pipeline`` is the step (None when it could not be built: role names are then not checked)."""
    role_pools = _mapping(checker.cfg, "trainer.role_pools")
    sizes = _mapping(checker.cfg, "trainer.resource_pools")
    if GLOBAL_POOL in sizes:
        checker.add(
            f"trainer.resource_pools.{GLOBAL_POOL}: the global pool's size is trainer.nnodes x "
            f"trainer.n_gpus_per_node; give other pools other names"
        )
    for pool, size in sizes.items():
        if pool != GLOBAL_POOL and not is_positive_int(size):
            checker.add(
                f"trainer.resource_pools.{pool}={size!r} is out of range: it must be >= 1 "
                f"(workers, one device each)"
            )
    for role, pool in role_pools.items():
        if pool != GLOBAL_POOL and pool not in sizes:
            close = difflib.get_close_matches(str(pool), list(sizes), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            checker.add(
                f"trainer.role_pools.{role}={pool!r} names a pool without a size: set "
                f"trainer.resource_pools.{pool}=<workers>.{hint}"
            )
    if pipeline is not None:
        roles = list(pipeline.roles())
        for role in role_pools:
            if role not in roles:
                close = difflib.get_close_matches(str(role), roles, n=1)
                hint = f" Did you mean trainer.role_pools.{close[0]}?" if close else ""
                checker.add(
                    f"trainer.role_pools.{role}: the step has no role {role!r} (its roles: "
                    f"{', '.join(roles)}).{hint}"
                )
    if is_split(checker.cfg):
        _check_split(checker, role_pools, sizes)
    _check_weight_sync(checker)
    if get(checker.cfg, "trainer.worker_backend") == IN_PROCESS:
        roles = tuple(pipeline.roles()) if pipeline is not None else ("actor",)
        for line in in_process_problems(checker.cfg, roles):
            checker.add(line)


def in_process_problems(cfg: Any, roles: tuple[str, ...]) -> list[str]:
    """Why ``trainer.worker_backend=in_process`` cannot host this run: this process holds one
    worker per pool, so each pool the roles are placed in must be of one worker; pools beyond
    the first need the CPU (on one GPU their weight channel would put two ranks on one device,
    which NCCL refuses); and no worker can be replaced."""
    problems = []
    pools = list(dict.fromkeys(pool_of(cfg, role) for role in roles))
    how = "use trainer.worker_backend=ray, or"
    for pool in pools:
        size, where = pool_size(cfg, pool)
        if is_positive_int(size) and size != 1:  # an unusable size is the range check's
            problems.append(
                f"trainer.worker_backend=in_process runs one worker per pool in this process, "
                f"but {where} = {size}: {how} set {_one_worker(cfg, pool)}"
            )
    if len(pools) > 1 and get(cfg, "trainer.device") == "cuda":
        problems.append(
            f"trainer.worker_backend=in_process hosts one pool on CUDA, but the roles are placed "
            f"in the pools {sorted(pools)}: {how} colocate every role (no trainer.role_pools, "
            f"actor_rollout_ref.hybrid_engine=true)"
        )
    if get(cfg, "trainer.max_restarts") not in (0, None):
        problems.append(
            "trainer.worker_backend=in_process cannot replace a lost worker (it is this "
            f"process): {how} set trainer.max_restarts=0"
        )
    return problems


def _one_worker(cfg: Any, pool: str) -> str:
    """The settings that make ``pool`` one worker."""
    prefix = sized_by_nodes(cfg, pool)
    if prefix is None:
        return f"trainer.resource_pools.{pool}=1"
    return f"{prefix}.nnodes=1 {prefix}.n_gpus_per_node=1"


def _check_split(checker: Checker, role_pools: dict[str, Any], sizes: dict[str, Any]) -> None:
    """The rollout pool of a split placement: sized once, by the rollout's keys, and the
    transport's settings in range."""
    if "rollout" in role_pools:
        checker.add(
            f"trainer.role_pools.rollout={role_pools['rollout']!r} contradicts {_SPLIT}, which "
            f"puts the rollout in its own pool {ROLLOUT_POOL!r} sized by {_ROLLOUT}.nnodes x "
            f"{_ROLLOUT}.n_gpus_per_node: drop trainer.role_pools.rollout (or set "
            f"actor_rollout_ref.hybrid_engine=true and place it with trainer.role_pools)"
        )
    if ROLLOUT_POOL in sizes:
        checker.add(
            f"trainer.resource_pools.{ROLLOUT_POOL}: with {_SPLIT} the {ROLLOUT_POOL!r} pool's "
            f"size is {_ROLLOUT}.nnodes x {_ROLLOUT}.n_gpus_per_node; set those instead"
        )
    for key in ("nnodes", "n_gpus_per_node"):
        checker.number(
            f"{_ROLLOUT}.{key}",
            lambda v: v >= 1,
            f">= 1 (the rollout pool's {'nodes' if key == 'nnodes' else 'workers per node'} "
            f"with {_SPLIT})",
            integer=True,
        )
    checker.number(
        f"{_ROLLOUT}.update_weights_bucket_megabytes",
        lambda v: v >= 1,
        ">= 1 (megabytes per bucket of the weight transport between pools)",
        integer=True,
    )
    # A rollout engine's own checks see this pool through role_world (vLLM: tensor parallelism
    # must divide it), whichever placement it is in.
    found, train = role_world(checker.cfg, "rollout"), get(checker.cfg, "data.train_batch_size")
    tp = get(checker.cfg, f"{_ROLLOUT}.tensor_model_parallel_size")
    if found and is_positive_int(train) and is_positive_int(tp) and found[0] % tp == 0:
        dp = found[0] // tp
        if train % dp:
            checker.add(
                f"data.train_batch_size {train} is not divisible by the rollout pool's {dp} "
                f"data-parallel rank(s) ({found[1]}, tensor parallel {tp}): prompts are split "
                f"across them; make the batch a multiple of {dp}"
            )


def _check_weight_sync(checker: Checker) -> None:
    """The weight sync's timeout and probe (read in every placement)."""
    sync = f"{_ROLLOUT}.weight_sync"
    checker.number(f"{sync}.timeout_s", lambda v: v > 0, "> 0 (seconds)")
    tokens = checker.number(
        f"{sync}.probe_tokens", lambda v: v >= 0, ">= 0 (0: no probe)", integer=True
    )
    checker.number(f"{sync}.probe_tolerance", lambda v: v >= 0, ">= 0 (nats)")
    if tokens and get(checker.cfg, f"{_ROLLOUT}.temperature") == 0:
        checker.add(
            f"{sync}.probe_tokens={tokens} needs {_ROLLOUT}.temperature > 0 (the probe compares "
            f"log-probs at the sampling temperature); set {sync}.probe_tokens=0 to skip it"
        )


def describe_placement(cfg: Any, roles: tuple[str, ...]) -> str:
    """``actor, rollout -> global (2 workers); ref -> pool 'ref' (1 worker)``."""
    by_pool: dict[str, list[str]] = {}
    for role in roles:
        by_pool.setdefault(pool_of(cfg, role), []).append(role)
    parts = []
    for pool, members in by_pool.items():
        found = role_world(cfg, members[0])
        size = f"{found[0]} worker(s)" if found else "size unknown"
        parts.append(f"{', '.join(members)} -> {pool} ({size})")
    return "; ".join(parts)
