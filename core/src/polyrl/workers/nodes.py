"""Multi-node pools: ``nnodes x n_gpus_per_node`` workers on ``nnodes`` Ray nodes.

verl's keys, verl's meaning: a pool sized by ``trainer.nnodes`` (or, for the rollout's own pool,
``actor_rollout_ref.rollout.nnodes``) has ``n_gpus_per_node`` workers on each of that many nodes
(with ``trainer.device=cpu``, ``n_gpus_per_node`` counts CPU worker processes per node).

A one-node pool keeps one placement-group bundle per worker, ``PACK``. A pool of several nodes is
one placement group of one bundle per node, holding that node's workers, with ``STRICT_SPREAD``:
Ray puts every bundle on a different node, so each node gets exactly ``n_gpus_per_node`` workers
(separate per-node groups could land on one node when it is big enough). Rank ``r`` runs in
bundle ``r // n_gpus_per_node``: the ranks of a node are consecutive, as with torchrun.

The cluster ``polyrl train`` starts itself is one node, so several nodes need a cluster to join
(:func:`require_cluster_to_join`, before Ray starts); a joined cluster with fewer usable nodes than
asked is one line at once (:func:`check_nodes_available`) instead of a placement wait.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import ray

from polyrl.config.checks.checker import get
from polyrl.config.checks.placement import GLOBAL_POOL, ROLLOUT_POOL, sized_by_nodes
from polyrl.errors import PolyrlError

__all__ = [
    "NodePlan",
    "WorkerNode",
    "alive_nodes",
    "check_nodes_available",
    "cluster_address",
    "describe_nodes",
    "placed_nodes",
    "plan_nodes",
    "pool_nnodes",
    "report_nodes",
    "require_cluster_to_join",
]

#: ``ray.init`` addresses that start a new local cluster rather than join one.
_LOCAL_ADDRESSES = ("", "local")


class NodePlan(NamedTuple):
    """The placement group of a pool: its bundles, Ray's strategy and each rank's bundle."""

    bundles: list[dict[str, float]]
    strategy: str
    bundle_of_rank: list[int]
    nnodes: int

    def describe(self) -> str:
        """What the group asks Ray for, e.g. ``2 x {'CPU': 1.0}`` or ``2 nodes x {...} each``."""
        if self.nnodes == 1:
            return f"{len(self.bundles)} x {self.bundles[0]}"
        return f"{self.nnodes} nodes x {self.bundles[0]} each ({self.strategy})"


class WorkerNode(NamedTuple):
    """The Ray node a worker runs on: its node id and IP address."""

    node_id: str
    ip: str


def plan_nodes(world_size: int, nnodes: int, per_worker: Mapping[str, float]) -> NodePlan:
    """The bundles for ``world_size`` workers reserving ``per_worker`` each on ``nnodes`` nodes."""
    if nnodes < 1 or world_size % nnodes:
        raise PolyrlError(
            f"{world_size} workers cannot be spread evenly over {nnodes} node(s): a pool has "
            f"nnodes x n_gpus_per_node workers"
        )
    if nnodes == 1:
        return NodePlan(
            [dict(per_worker) for _ in range(world_size)], "PACK", list(range(world_size)), 1
        )
    per_node = world_size // nnodes
    node_share = {name: amount * per_node for name, amount in per_worker.items()}
    return NodePlan(
        [dict(node_share) for _ in range(nnodes)],
        "STRICT_SPREAD",
        [rank // per_node for rank in range(world_size)],
        nnodes,
    )


def check_nodes_available(plan: NodePlan, pool: str, alive_nodes: Sequence[dict[str, Any]]) -> None:
    """One line when fewer of the cluster's ``alive_nodes`` (``ray.nodes()`` entries) than the
    pool's nodes could each hold one node's share: Ray would wait for nodes that no one starts."""
    if plan.nnodes == 1:
        return
    share = plan.bundles[0]
    able = [
        entry
        for entry in alive_nodes
        if all(entry.get("Resources", {}).get(key, 0) >= amount for key, amount in share.items())
    ]
    if len(able) < plan.nnodes:
        raise PolyrlError(
            f"pool {pool!r} needs {plan.nnodes} Ray nodes with {share} each, but the cluster has "
            f"{len(alive_nodes)} node(s), {len(able)} of them with that much: start Ray on more "
            f"nodes (`ray start --address=<head>:<port>` on each), or lower the pool's nnodes / "
            f"n_gpus_per_node (trainer.*, or actor_rollout_ref.rollout.* for the rollout's pool)"
        )


def placed_nodes(
    plan: NodePlan, bundle_nodes: Mapping[int, str], alive_nodes: Sequence[dict[str, Any]]
) -> list[WorkerNode]:
    """Each rank's node, from the placement group's ``bundles_to_node_id`` (Ray's record of where
    it put each bundle, hence each worker in it) and ``ray.nodes()`` for the addresses."""
    ips = {entry["NodeID"]: entry["NodeManagerAddress"] for entry in alive_nodes}
    nodes = []
    for bundle in plan.bundle_of_rank:
        node_id = str(bundle_nodes[bundle])
        nodes.append(WorkerNode(node_id, ips.get(node_id, "?")))
    return nodes


def describe_nodes(pool: str, nodes: Sequence[WorkerNode]) -> str:
    """One line: the nodes a pool's workers run on, e.g. ``polyrl: pool 'global': 2 worker(s)
    on 2 node(s): 10.0.0.1 (node 1a2b3c4d) ranks 0; 10.0.0.2 (node 5e6f7a8b) ranks 1``."""
    ranks: dict[WorkerNode, list[int]] = {}
    for rank, worker_node in enumerate(nodes):
        ranks.setdefault(worker_node, []).append(rank)
    where = "; ".join(
        f"{host.ip} (node {host.node_id[:8]}) ranks {','.join(map(str, on_host))}"
        for host, on_host in ranks.items()
    )
    return f"polyrl: pool {pool!r}: {len(nodes)} worker(s) on {len(ranks)} node(s): {where}"


def alive_nodes() -> list[dict[str, Any]]:
    """The cluster's live nodes (``ray.nodes()`` lists dead ones too)."""
    return [entry for entry in ray.nodes() if entry.get("Alive")]


def report_nodes(pools: Mapping[str, Sequence[WorkerNode]]) -> None:
    """Print where each pool's workers run (:func:`describe_nodes`) on a cluster of several
    nodes, where that is the first thing to know when a rank is slow or fails."""
    if len(alive_nodes()) > 1:
        for pool, nodes in pools.items():
            print(describe_nodes(pool, nodes), file=sys.stderr)


def pool_nnodes(cfg: Any, pool: str) -> int:
    """How many nodes ``pool`` spans: its ``nnodes`` key, or 1 for a pool sized by
    ``trainer.resource_pools`` (a worker count, placed where Ray finds room)."""
    prefix = sized_by_nodes(cfg, pool)
    return 1 if prefix is None else int(get(cfg, f"{prefix}.nnodes"))


def cluster_address(cfg: Any) -> str:
    """The Ray cluster a run joins: ``trainer.ray_init.address``, else ``RAY_ADDRESS`` (empty:
    none, polyrl starts its own)."""
    configured = get(cfg, "trainer.ray_init")
    address = configured.get("address") if isinstance(configured, dict) else None
    return str(address or os.environ.get("RAY_ADDRESS") or "")


def require_cluster_to_join(cfg: Any) -> None:
    """One line, before Ray starts, when a pool spans several nodes but there is no cluster to
    join: the cluster polyrl would start is this machine alone."""
    if cluster_address(cfg) not in _LOCAL_ADDRESSES:
        return
    for pool in (GLOBAL_POOL, ROLLOUT_POOL):
        nnodes = pool_nnodes(cfg, pool)
        if nnodes > 1:
            key = sized_by_nodes(cfg, pool)
            raise PolyrlError(
                f"{key}.nnodes={nnodes} needs a Ray cluster of {nnodes} nodes, but RAY_ADDRESS is "
                f"not set (polyrl would start a one-node cluster on this machine): run `ray start "
                f"--head` on one node and `ray start --address=<head>:6379` on the others, then "
                f"set RAY_ADDRESS=<head>:6379 (or set {key}.nnodes=1)"
            )
