"""Which workers host which roles, and the driver's handle on them.

Roles are placed in resource pools (``trainer.role_pools``: role -> pool; a role not listed is
in the ``global`` pool of ``trainer.nnodes x trainer.n_gpus_per_node`` workers; any other pool
needs its size in ``trainer.resource_pools``). Each pool is one
:class:`~polyrl.workers.worker_group.WorkerGroup` of :class:`~polyrl.workers.worker.Worker`
processes, one per device, and every worker of a pool hosts all the pool's roles (colocated:
verl's hybrid engine when actor, rollout and reference share the global pool).
``actor_rollout_ref.hybrid_engine=false`` gives the rollout a pool of its own (split placement);
the rules are :mod:`polyrl.config.checks.placement`'s.

:class:`RoleWorkers` is what the step calls (the :class:`polyrl.step.context.RoleCalls`
protocol): ``call(role, method, *args, dispatch=...)`` dispatches over that role's data-parallel
mesh (:mod:`polyrl.workers.dispatch`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from polyrl.config.checks.checker import get, is_positive_int
from polyrl.config.checks.placement import (
    GLOBAL_POOL,
    IN_PROCESS,
    in_process_problems,
    pool_of,
    pool_size,
    sized_by_nodes,
)
from polyrl.errors import ConfigError, PolyrlError
from polyrl.workers.dispatch import Dispatch, gather_outputs, split_args
from polyrl.workers.group import SPMDGroup
from polyrl.workers.mesh import DataParallelRank, check_mesh
from polyrl.workers.weight_sync import WeightSync, WeightSyncSettings
from polyrl.workers.worker_plan import WorkerPlan


class PoolPlan(NamedTuple):
    """A pool's number of workers and the roles each of them hosts (in first-use order)."""

    size: int
    roles: tuple[str, ...]


def plan_pools(cfg: Any, roles: Sequence[str]) -> dict[str, PoolPlan]:
    """``{pool: (size, roles)}`` for the ``roles`` the step uses, pools in first-use order.

    Which pool a role is in and how big a pool is are :mod:`polyrl.config.checks.placement`'s
    rules (the ones the validator checks): the global pool, the rollout's own pool with
    ``actor_rollout_ref.hybrid_engine=false``, or ``trainer.role_pools`` /
    ``trainer.resource_pools``. Entries of ``trainer.role_pools`` for roles the step does not
    use, and pools no used role is in, are ignored (a recipe may place roles of several
    algorithms).
    """
    resource_pools = dict(cfg.trainer.resource_pools)
    if GLOBAL_POOL in resource_pools:
        global_size, _ = pool_size(cfg, GLOBAL_POOL)
        raise ConfigError(
            f"trainer.resource_pools.{GLOBAL_POOL}: the {GLOBAL_POOL!r} pool's size is "
            f"trainer.nnodes x trainer.n_gpus_per_node = {global_size}; give other pools other "
            f"names"
        )
    members: dict[str, list[str]] = {}
    for role in dict.fromkeys(roles):
        members.setdefault(pool_of(cfg, role), []).append(role)
    plan = {}
    for pool, pool_roles in members.items():
        size, where = pool_size(cfg, pool)
        if size is None and pool not in resource_pools and sized_by_nodes(cfg, pool) is None:
            raise ConfigError(
                f"trainer.role_pools puts the role(s) {pool_roles} in the pool {pool!r}, which "
                f"trainer.resource_pools does not size (it sizes {sorted(resource_pools)}); add "
                f"trainer.resource_pools.{pool}=<number of workers>"
            )
        if not is_positive_int(size):
            given = "" if size is None else f" = {size!r}"
            raise ConfigError(
                f"the pool {pool!r} (roles {pool_roles}) has no usable size ({where}{given}); "
                f"it needs a whole number of workers, at least 1"
            )
        plan[pool] = PoolPlan(size, tuple(pool_roles))
    return plan


class RoleWorkers:
    """The driver's handle on the roles: one worker group per pool, meshes per role.

    ``groups`` maps each pool to its group (:class:`~polyrl.workers.worker_group.WorkerGroup`,
    or :class:`~polyrl.workers.local.LocalWorkerGroup` in tests) of workers serving ``mesh``,
    ``call``, ``sync_weights``, ``save_checkpoint``, ``load_checkpoint``, ``export_hf`` and
    ``shutdown`` (:class:`~polyrl.workers.worker.Worker`); ``role_pools`` maps each role to its
    pool. ``pad_values`` right-pads gathered batches of different widths per key (token ids
    with the pad id); ``call_timeout_s`` bounds every call (None: no limit, the collective
    timeout of the workers still applies); ``weight_sync`` sets the weight sync's transport
    and probe (default: no probe).
    """

    def __init__(
        self,
        groups: Mapping[str, SPMDGroup],
        role_pools: Mapping[str, str],
        *,
        pad_values: dict[str, int | float] | None = None,
        call_timeout_s: float | None = None,
        weight_sync: WeightSyncSettings | None = None,
    ) -> None:
        self.groups = dict(groups)
        self.weight_sync = WeightSync(weight_sync)
        self.role_pools = dict(role_pools)
        unknown = {r: p for r, p in self.role_pools.items() if p not in self.groups}
        if unknown:
            raise PolyrlError(f"roles placed in pools without a worker group: {unknown}")
        self.pad_values = dict(pad_values or {})
        self.call_timeout_s = call_timeout_s
        self._meshes: dict[str, tuple[DataParallelRank, ...]] = {}
        for role in self.role_pools:
            group = self._group(role)
            mesh = tuple(
                group.run(
                    "mesh",
                    [(role,)] * group.world_size,
                    what=f"{role}.mesh",
                    timeout_s=call_timeout_s,
                )
            )
            check_mesh(mesh, role)
            self._meshes[role] = mesh

    # ---- where roles are -----------------------------------------------------------------------
    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self.role_pools)

    def pool_of(self, role: str) -> str:
        if role not in self.role_pools:
            raise PolyrlError(
                f"no worker hosts the role {role!r}; the roles started are {list(self.roles)} "
                f"(the step's stages declare which roles exist)"
            )
        return self.role_pools[role]

    def _group(self, role: str) -> SPMDGroup:
        return self.groups[self.pool_of(role)]

    def mesh(self, role: str) -> tuple[DataParallelRank, ...]:
        """The data-parallel position of each worker of ``role``'s pool, in rank order."""
        self.pool_of(role)
        return self._meshes[role]

    # ---- RoleCalls -----------------------------------------------------------------------------
    def dp_size(self, role: str) -> int:
        return self.mesh(role)[0].dp_size

    def call(
        self,
        role: str,
        method: str,
        *args: Any,
        dispatch: Dispatch = Dispatch.DP_SPLIT,
        timeout_s: float | None = None,
    ) -> Any:
        """``method`` of ``role`` on every worker hosting it, arguments and outputs by
        ``dispatch`` over the role's mesh."""
        mesh = self.mesh(role)
        per_worker = split_args(dispatch, mesh, args)
        outputs = self._group(role).run(
            "call",
            [(role, method, *worker_args) for worker_args in per_worker],
            what=f"{role}.{method}",
            timeout_s=self._timeout(timeout_s),
        )
        return gather_outputs(dispatch, mesh, outputs, self.pad_values)

    def sync_weights(self, source: str, target: str) -> dict[str, float]:
        """Stream ``source``'s full weights into every worker of ``target``: in memory when
        they share a pool, over a transport channel between pools, then probed
        (:mod:`polyrl.workers.weight_sync`). ``{"bytes": per worker, "seconds": slowest worker,
        "weight_sync/...": metrics}``."""
        return self.weight_sync.sync(self, source, target)

    # ---- checkpoints, export, shutdown -------------------------------------------------------
    def save_checkpoint(self, directory: str) -> list[str]:
        """Every pool writes its roles with a checkpoint into ``directory/<role>``; the roles
        saved."""
        return self._every_pool("save_checkpoint", directory)

    def load_checkpoint(self, directory: str) -> list[str]:
        """Every pool restores its roles from ``directory/<role>``, then the rollout gets the
        actor's restored weights (in its pool, a colocated one already did); the roles
        loaded."""
        loaded = self._every_pool("load_checkpoint", directory)
        if {"actor", "rollout"} <= set(self.role_pools) and (
            self.pool_of("actor") != self.pool_of("rollout")
        ):
            self.sync_weights("actor", "rollout")
        return loaded

    def export_hf(self, directory: str, role: str = "actor") -> None:
        """``role``'s model as a Hugging Face folder in ``directory``."""
        group = self._group(role)
        group.run(
            "export_hf",
            [(directory, role)] * group.world_size,
            what=f"{role}.export_hf",
            timeout_s=self.call_timeout_s,
        )

    def _every_pool(self, method: str, directory: str) -> list[str]:
        done: list[str] = []
        for pool, group in self.groups.items():
            per_rank = group.run(
                method,
                [(directory,)] * group.world_size,
                what=f"{method} (pool {pool!r})",
                timeout_s=self.call_timeout_s,
            )
            done += per_rank[0]
        return done

    def shutdown(self) -> None:
        """Stop every pool (each is stopped even when another fails to); safe to call twice."""
        groups, self.groups = self.groups, {}
        failures = []
        for pool, group in groups.items():
            try:
                group.shutdown()
            except Exception as exc:  # noqa: BLE001 - every pool gets its chance
                failures.append(f"{pool}: {type(exc).__name__}: {exc}")
        if failures:
            raise PolyrlError(f"stopping the worker pools failed: {failures}")

    def _timeout(self, timeout_s: float | None) -> float | None:
        return timeout_s if timeout_s is not None else self.call_timeout_s


def start_role_workers(
    cfg: Any,
    roles: tuple[str, ...],
    *,
    model_path: str,
    total_training_steps: int,
    tokens: dict[str, Any],
    role_classes: Mapping[str, type | str] | None = None,
    plan: WorkerPlan | None = None,
    worker_cls: type | None = None,
    ready_timeout_s: float = 1800.0,
    call_timeout_s: float | None = None,
) -> RoleWorkers:
    """Start one Ray worker group per pool of :func:`plan_pools` (with
    ``trainer.worker_backend=in_process``: each pool's one worker, in this process) and return
    the handle.

    ``roles``: the roles the step uses (``StepPipeline.roles()``); ``role_classes``: classes of
    roles beyond core's (``AlgorithmSpec.role_classes``, import strings preferred: they are
    resolved in the workers); ``plan``: the workers' part of the run plan
    (:meth:`polyrl.plan.RunPlan.worker_plan`: the plugins they build, and role classes);
    ``tokens``: ``pad_token_id`` and ``eos_token_ids``.
    ``worker_cls`` replaces :class:`~polyrl.workers.worker.Worker` (a subclass that times calls,
    in benchmarks). Ray is started with defaults when it is not running
    (:func:`~polyrl.workers.worker_group.ensure_ray`). Each Ray worker reserves at most one
    CPU: fewer (a fraction) when Ray has fewer CPUs available than there are workers.
    """
    if not roles:
        raise PolyrlError("start_role_workers needs at least one role")
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    pools = plan_pools(cfg, roles)
    init_kwargs = {
        "cfg": OmegaConf.to_container(cfg, resolve=True),
        "role_classes": dict(role_classes or {}),
        "plan": plan,
        "model_path": model_path,
        "total_training_steps": int(total_training_steps),
        "tokens": dict(tokens),
    }
    if get(cfg, "trainer.worker_backend") == IN_PROCESS:
        problems = in_process_problems(cfg, tuple(roles))
        if problems:
            raise ConfigError("; ".join(problems))
        groups = _in_process_groups(pools, worker_cls, ready_timeout_s, init_kwargs)
    else:
        groups = _ray_groups(cfg, pools, worker_cls, ready_timeout_s, init_kwargs)
    try:
        pad_id = tokens.get("pad_token_id")
        pad_values = {} if pad_id is None else {"input_ids": pad_id, "responses": pad_id}
        return RoleWorkers(
            groups,
            {role: pool for pool, p in pools.items() for role in p.roles},
            pad_values=pad_values,
            call_timeout_s=call_timeout_s,
            # the weight sync's settings are the rollout's (a run without one never syncs)
            weight_sync=WeightSyncSettings.from_config(cfg, tokens) if "rollout" in roles else None,
        )
    except BaseException:
        for group in groups.values():
            with contextlib.suppress(Exception):
                group.shutdown()
        raise


def _in_process_groups(
    pools: Mapping[str, PoolPlan],
    worker_cls: type | None,
    ready_timeout_s: float,
    init_kwargs: dict[str, Any],
) -> dict[str, SPMDGroup]:
    """Each pool's one worker, built in this process (``trainer.worker_backend=in_process``).
    The first pool's worker starts a process group of one on a loopback port that it binds
    itself (port 0); the other pools' workers share it (a group of one rank has nothing to
    exchange), and weights travel between pools over the transport's own channel, as between
    processes."""
    from polyrl.workers.local import LocalWorkerGroup
    from polyrl.workers.worker import Worker

    groups: dict[str, SPMDGroup] = {}
    try:
        for pool, (_, pool_roles) in pools.items():
            joins = {} if groups else {"master_addr": "127.0.0.1", "master_port": 0}
            groups[pool] = LocalWorkerGroup(
                worker_cls or Worker,
                world_size=1,
                name=pool,
                ready_timeout_s=ready_timeout_s,
                init_kwargs={**init_kwargs, "roles": pool_roles, "pool": pool, **joins},
            )
        return groups
    except BaseException:
        for group in reversed(groups.values()):  # the first, which holds the group, last
            with contextlib.suppress(Exception):
                group.shutdown()
        raise


def _ray_groups(
    cfg: DictConfig,
    pools: Mapping[str, PoolPlan],
    worker_cls: type | None,
    ready_timeout_s: float,
    init_kwargs: dict[str, Any],
) -> dict[str, SPMDGroup]:
    """One Ray worker group per pool (Ray started with defaults when it is not running)."""
    import ray

    from polyrl.workers.nodes import pool_nnodes, report_nodes
    from polyrl.workers.worker import Worker
    from polyrl.workers.worker_group import WorkerGroup, ensure_ray

    ensure_ray(joined_growth_s=float(getattr(cfg.trainer, "joined_cluster_growth_s", 30.0)))
    device = str(cfg.trainer.device)
    total = sum(pool.size for pool in pools.values())
    available = float(ray.available_resources().get("CPU", 0.0))
    cpus = min(1.0, math.floor(100 * available / total) / 100) or 1.0
    threads = 1 if device == "cuda" else max(1, (os.cpu_count() or 1) // total)
    groups: dict[str, SPMDGroup] = {}
    try:
        for pool, (size, pool_roles) in pools.items():
            groups[pool] = WorkerGroup(
                worker_cls or Worker,
                world_size=size,
                device=device,
                name=pool,
                ready_timeout_s=ready_timeout_s,
                cpus_per_worker=cpus,
                threads_per_worker=threads,
                log_dir=os.path.abspath(str(cfg.trainer.default_local_dir)),
                nnodes=pool_nnodes(cfg, pool),
                init_kwargs={**init_kwargs, "roles": pool_roles, "pool": pool},
            )
        report_nodes({pool: group.nodes for pool, group in groups.items()})
        return groups
    except BaseException:
        for group in groups.values():
            with contextlib.suppress(Exception):
                group.shutdown()
        raise
