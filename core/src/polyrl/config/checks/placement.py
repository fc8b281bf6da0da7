"""Placement: which resource pool each worker role runs in (``trainer.role_pools``) and how many
workers each pool has (``trainer.resource_pools``).

Roles not named in ``trainer.role_pools`` share the global pool of ``trainer.nnodes x
trainer.n_gpus_per_node`` workers, colocated (verl's hybrid engine). For now the actor and the
rollout must share a pool: weights move from one to the other in memory, and transport between
pools is not implemented yet.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from polyrl.config.checks.checker import Checker, get, is_positive_int

if TYPE_CHECKING:
    from polyrl.step.pipeline import StepPipeline

GLOBAL_POOL = "global"


def _mapping(cfg: Any, key: str) -> dict[str, Any]:
    value = get(cfg, key)
    return value if isinstance(value, dict) else {}


def pool_of(cfg: Any, role: str) -> str:
    """The pool ``role`` runs in: its entry of ``trainer.role_pools``, else the global pool."""
    return str(_mapping(cfg, "trainer.role_pools").get(role, GLOBAL_POOL))


def role_world(cfg: Any, role: str) -> tuple[int, str] | None:
    """``(workers, description)`` of the pool ``role`` runs in, e.g. ``(8, "world size 8 =
    trainer.nnodes 2 x trainer.n_gpus_per_node 4")``; None when the sizes are unusable (the
    range and placement checks report why)."""
    pool = pool_of(cfg, role)
    if pool == GLOBAL_POOL:
        nnodes, per_node = get(cfg, "trainer.nnodes"), get(cfg, "trainer.n_gpus_per_node")
        if not (is_positive_int(nnodes) and is_positive_int(per_node)):
            return None
        world = nnodes * per_node
        return world, (
            f"world size {world} = trainer.nnodes {nnodes} x trainer.n_gpus_per_node {per_node}"
        )
    size = _mapping(cfg, "trainer.resource_pools").get(pool)
    if not is_positive_int(size):
        return None
    return size, f"world size {size} of pool {pool!r} (trainer.resource_pools.{pool})"


def check_placement(checker: Checker, pipeline: StepPipeline | None) -> None:
    """Pools have sizes, placed roles are roles of the step, and actor and rollout share a pool.
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
    actor, rollout = pool_of(checker.cfg, "actor"), pool_of(checker.cfg, "rollout")
    if actor != rollout:
        checker.add(
            f"trainer.role_pools puts the actor in pool {actor!r} and the rollout in pool "
            f"{rollout!r}: they must share a pool for now (weights move between them in memory; "
            f"weight transport between pools is not implemented yet)"
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
