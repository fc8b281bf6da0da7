"""A group of Ray actors, one per device, placed with a placement group, called SPMD-style.

The controller calls ``group.call("method", batch, dispatch=Dispatch.DP_SPLIT)``: the batch is cut
by rank, every actor runs the method at once, the outputs come back gathered. When any rank fails
the call raises at once with that rank's error instead of waiting on ranks that are now stuck in a
collective (a hang is the worst failure mode of distributed RL).
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from polyrl.errors import PolyrlError
from polyrl.workers.dispatch import Dispatch, gather_outputs, split_args


class WorkerError(PolyrlError):
    """A worker raised; the message names the rank and carries its error."""


def ensure_ray(num_cpus: int | None = None, extra: dict[str, Any] | None = None) -> None:
    """Start (or join, when ``RAY_ADDRESS`` is set) Ray with quiet, offline-friendly defaults."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray starts its workers at nice 15; here the workers ARE the compute (engines), so on a
    # machine with any other load they starve (measured: engine calls 16x slower at load 8 on
    # 2 cores, benchmarks/README.md). Only applies when this process starts the local Ray.
    os.environ.setdefault("RAY_worker_niceness", "0")
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    if not os.environ.get("RAY_ADDRESS") and num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    kwargs.update(extra or {})
    ray.init(**kwargs)


@ray.remote(num_cpus=0)
def _rendezvous_address(loopback: bool) -> tuple[str, int]:
    """IP of the node hosting rank 0, and a free port there, for torch.distributed."""
    host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return host, sock.getsockname()[1]


class WorkerGroup:
    """``world_size`` actors of ``worker_cls``; rank ``r`` runs in placement-group bundle ``r``."""

    def __init__(
        self,
        worker_cls: type,
        *,
        world_size: int,
        device: str,
        init_kwargs: dict[str, Any],
        ready_timeout_s: float = 1800.0,
    ) -> None:
        self.world_size = world_size
        if device == "cuda":
            bundles = [{"GPU": 1, "CPU": 1} for _ in range(world_size)]
        else:
            bundles = [{"CPU": 1} for _ in range(world_size)]
        self.placement_group = placement_group(bundles, strategy="PACK")
        try:
            ray.get(self.placement_group.ready(), timeout=120)
        except ray.exceptions.GetTimeoutError as exc:
            raise PolyrlError(
                f"Ray could not reserve {world_size} x {bundles[0]} within 120 s; the cluster has "
                f"{ray.cluster_resources()}. Lower trainer.n_gpus_per_node / trainer.nnodes or "
                f"add resources."
            ) from exc

        def strategy(rank: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=rank
            )

        master_addr, master_port = ray.get(
            _rendezvous_address.options(scheduling_strategy=strategy(0)).remote(
                loopback=device == "cpu"
            )
        )
        remote_cls = ray.remote(worker_cls)
        resources = {"num_gpus": 1, "num_cpus": 1} if device == "cuda" else {"num_cpus": 1}
        # On CPU the workers share the machine's cores: give each its share of threads (Ray's
        # default of one thread per actor would leave cores idle when there are fewer workers).
        threads = 1 if device == "cuda" else max(1, (os.cpu_count() or 1) // world_size)
        env = {
            "OMP_NUM_THREADS": str(threads),
            "MASTER_ADDR": master_addr,
            # transformers' per-load progress bars, repeated by every worker, would bury the
            # run's own progress display.
            "HF_HUB_DISABLE_PROGRESS_BARS": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
        }
        self.workers = [
            remote_cls.options(
                scheduling_strategy=strategy(rank),
                runtime_env={"env_vars": env},
                **resources,
            ).remote(
                rank=rank,
                world_size=world_size,
                master_addr=master_addr,
                master_port=master_port,
                **init_kwargs,
            )
            for rank in range(world_size)
        ]
        self._wait([w.ready.remote() for w in self.workers], "start", ready_timeout_s)

    def call(
        self,
        method: str,
        *args: Any,
        dispatch: Dispatch = Dispatch.BROADCAST,
        timeout_s: float | None = None,
    ) -> Any:
        """Run ``method`` on every rank with the arguments ``dispatch`` gives it."""
        per_rank = split_args(dispatch, self.world_size, args)
        refs = [
            getattr(worker, method).remote(*rank_args)
            for worker, rank_args in zip(self.workers, per_rank)
        ]
        return gather_outputs(dispatch, self._wait(refs, method, timeout_s))

    def _wait(self, refs: list[Any], what: str, timeout_s: float | None) -> list[Any]:
        """All results, or the first failure at once (with its rank), or a timeout error."""
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
            if not done:
                raise WorkerError(
                    f"worker call {what!r} did not finish within {timeout_s} s on ranks "
                    f"{[refs.index(p) for p in pending]}"
                )
            try:
                ray.get(done[0])
            except ray.exceptions.RayError as exc:
                rank = refs.index(done[0])
                cause = getattr(exc, "cause", None) or exc
                raise WorkerError(
                    f"worker rank {rank} failed in {what!r}: {type(cause).__name__}: {cause}"
                ) from exc
        return ray.get(refs)

    def shutdown(self) -> None:
        """Stop the actors and free the placement group."""
        # A worker that failed earlier cannot shut down cleanly; it is killed below.
        with contextlib.suppress(PolyrlError):
            self._wait([w.shutdown.remote() for w in self.workers], "shutdown", 60)
        for worker in self.workers:
            ray.kill(worker)
        remove_placement_group(self.placement_group)
