"""A group of Ray actors, one per device, placed with a placement group, called SPMD-style.

Generic over the worker class (:class:`~polyrl.workers.worker.Worker` in training; any class with
a ``ready()`` method in tests). ``group.call("method", batch, dispatch=Dispatch.DP_SPLIT)`` cuts
the batch by data-parallel rank, every actor runs the method at once, the outputs come back
gathered. When any rank fails the call raises at once with that rank's error instead of waiting on
ranks that are now stuck in a collective (a hang is the worst failure mode of distributed RL).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from polyrl.batch import Batch
from polyrl.errors import PolyrlError
from polyrl.run_log import keep
from polyrl.workers.cluster_probe import alive_node_addresses, wait_until
from polyrl.workers.group import SPMDGroup, WorkerError
from polyrl.workers.nodes import alive_nodes, check_nodes_available, placed_nodes, plan_nodes
from polyrl.workers.rendezvous import rendezvous_port
from polyrl.workers.stop_signals import stop_signals_deferred

__all__ = ["WorkerError", "WorkerGroup", "ensure_ray"]


#: How long joining the cluster named by ``RAY_ADDRESS`` may take to answer at all.
RAY_CONNECT_TIMEOUT_S = 15.0
#: How long the cluster's GCS may take to answer, once something accepted the connection (Ray
#: answers in milliseconds; anything else never does).
RAY_ANSWER_TIMEOUT_S = 10.0
#: Ray's switch for single-machine mode (named for the platforms where it is the default): every
#: Ray server and worker then listens on 127.0.0.1 only, and the node's address is 127.0.0.1.
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

#: Whether this process started the Ray cluster it uses (then nothing outside it can add
#: resources, so a request the cluster cannot hold fails at once instead of waiting).
_started_local_cluster = False
#: The address of the cluster this process joined (None: it started its own, or has none yet).
_joined_address: str | None = None
#: How long that cluster may take to grow to what a pool asks (``trainer.joined_cluster_growth_s``).
_joined_growth_s = 30.0


def ensure_ray(
    num_cpus: int | None = None,
    extra: dict[str, Any] | None = None,
    joined_growth_s: float = 30.0,
) -> None:
    """Start a local Ray (or join the cluster of ``RAY_ADDRESS`` / ``trainer.ray_init.address``)
    with quiet, offline-friendly defaults.

    A local cluster listens on 127.0.0.1 only (so do its workers and, through the node address,
    torch.distributed's rendezvous); a cluster address is checked to answer, as Ray, within
    :data:`RAY_CONNECT_TIMEOUT_S` (one line naming it otherwise). Ctrl-C or SIGTERM while Ray
    starts or is joined become the usual clean stop (one line, 130/143, Ray's processes ended).
    A joined cluster lacking what a pool asks gets ``joined_growth_s`` to grow
    (:func:`check_cluster_fits`).
    """
    global _started_local_cluster, _joined_address, _joined_growth_s
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray starts its workers at nice 15; here the workers ARE the compute (engines), so on a
    # machine with any other load they starve (measured: engine calls 16x slower at load 8 on
    # 2 cores, benchmarks/README.md). Only applies when this process starts the local Ray.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # Ray starts idle worker processes for the first driver, before any job exists; a worker
    # serves one job, so polyrl's actors start processes of their own and those idle ones only
    # take CPU from the run's own workers while they start (the commit that added this line
    # has the measurement). Only applies when this process starts the local Ray.
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    kwargs.update(extra or {})
    address = str(kwargs.get("address") or os.environ.get("RAY_ADDRESS") or "")
    if address and address not in ("local", "auto"):
        _check_reachable(address)
        if not address.startswith("ray://"):
            _join_on_the_cluster_address(address)
    elif not address or address == "local":
        # Nothing outside this machine can connect: no token to manage. A joined cluster keeps
        # its own authentication setting.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        _listen_on_loopback()
        if num_cpus is not None:
            kwargs.setdefault("num_cpus", num_cpus)
    _init_with_signals_kept(kwargs)
    _started_local_cluster = not address or address == "local"
    _joined_address = None if _started_local_cluster else address
    _joined_growth_s = joined_growth_s


def _listen_on_loopback() -> None:
    """Put the local cluster on 127.0.0.1. Ray reads the switch into a constant when it is
    imported, which has happened in this process already: set that constant too (the processes
    Ray starts read the variable). ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1`` opts out."""
    from ray._private import ray_constants

    os.environ.setdefault(_LOOPBACK_ENV, "0")
    if os.environ[_LOOPBACK_ENV] == "0":
        ray_constants.ENABLE_RAY_CLUSTER = False


def _check_reachable(address: str) -> None:
    """One line when nothing answers at ``address`` (``host:port`` or ``ray://host:port``):
    ``ray.init`` itself would retry for minutes."""
    host, _, port = address.split("://")[-1].rpartition(":")
    if not host or not port.isdigit():
        raise PolyrlError(
            f"RAY_ADDRESS={address!r} is not host:port (or ray://host:port): give the address "
            f"`ray start --head` printed, or unset RAY_ADDRESS to start a local cluster"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise PolyrlError(
            f"cannot reach the Ray cluster at RAY_ADDRESS={address} within "
            f"{RAY_CONNECT_TIMEOUT_S:g} s ({exc.strerror or exc}): start it there "
            f"(`ray start --head`) or unset RAY_ADDRESS to start a local cluster"
        ) from None


def _join_on_the_cluster_address(address: str) -> None:
    """Check that Ray answers at ``address``, and join a cluster on this machine's loopback
    (every node at 127.0.0.1: a ``ray start --head`` in single-machine mode) as one of its own.

    Ray rewrites a loopback address to the machine's network address before it connects, and
    then looks for a node at that address; a loopback-only cluster has neither, and the join
    would wait for ever. In single-machine mode this driver keeps the loopback address.
    """
    nodes = alive_node_addresses(address, RAY_ANSWER_TIMEOUT_S)
    host = address.rpartition(":")[0]
    if nodes and host in _LOOPBACK_HOSTS and all(node == "127.0.0.1" for node in nodes):
        _listen_on_loopback()


def _init_with_signals_kept(kwargs: dict[str, Any]) -> None:
    """``ray.init``, keeping this process's SIGTERM/SIGINT handlers.

    Ray's driver installs its own SIGTERM handler (``sys.exit``, with a native stack dump later),
    skipping the controller's cleanup; the handlers this process had are put back (the CLI turns
    SIGTERM into a clean stop that shuts the workers down). A signal that Ray's handler took
    during ``ray.init`` is seen through a wakeup pipe and raised again once ours are back.
    """
    signals = (signal.SIGTERM, signal.SIGINT)
    handlers = {sig: signal.getsignal(sig) for sig in signals}
    main_thread = threading.current_thread() is threading.main_thread()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    previous_wakeup = signal.set_wakeup_fd(wake_write) if main_thread else None
    caught: int | None = None
    try:
        ray.init(**kwargs)
    except SystemExit:
        caught = _signal_seen(wake_read, signals)
        if caught is None:
            raise
    finally:
        if previous_wakeup is not None:
            signal.set_wakeup_fd(previous_wakeup)
        os.close(wake_read)
        os.close(wake_write)
        for sig, handler in handlers.items():
            if callable(handler) or handler in (signal.SIG_DFL, signal.SIG_IGN):
                signal.signal(sig, handler)
    if caught is not None:
        with contextlib.suppress(Exception):
            ray.shutdown()
        signal.raise_signal(caught)


def _signal_seen(wake_read: int, signals: Sequence[int]) -> int | None:
    """The first of ``signals`` written to the wakeup pipe, if any."""
    try:
        seen = os.read(wake_read, 1024)
    except BlockingIOError:
        return None
    return next((number for number in seen if number in signals), None)


def check_cluster_fits(bundles: Sequence[dict[str, float]], pool: str) -> None:
    """One line when the cluster cannot hold ``bundles`` at all (GPUs asked on a machine without
    any): Ray would otherwise wait for resources that may never come. The cluster this process
    started cannot grow, so it fails at once; a joined one may (an autoscaler, a node being
    started): it gets ``trainer.joined_cluster_growth_s`` to. Ray started by someone else (a
    test's own ``ray.init``) is left to the placement timeout."""
    if not _started_local_cluster and _joined_address is None:
        return
    needs = {
        resource: sum(bundle.get(resource, 0) for bundle in bundles)
        for resource in sorted({key for bundle in bundles for key in bundle})
    }

    def fits() -> bool:
        total = ray.cluster_resources()
        return all(need <= total.get(resource, 0) for resource, need in needs.items())

    if _joined_address is not None and wait_until(fits, _joined_growth_s):
        return
    total = ray.cluster_resources()
    where = "this machine's Ray cluster"
    if _joined_address is not None:
        where = f"the Ray cluster at RAY_ADDRESS={_joined_address} after {_joined_growth_s:g} s"
    for resource, need in needs.items():
        have = total.get(resource, 0)
        if need > have:
            fix = (
                "set trainer.device=cpu, or lower trainer.n_gpus_per_node / trainer.nnodes / "
                "trainer.resource_pools"
                if resource == "GPU"
                else "lower trainer.n_gpus_per_node / trainer.resource_pools or raise the CPUs "
                "Ray may use (trainer.ray_init.num_cpus)"
            )
            raise PolyrlError(
                f"pool {pool!r} needs {need:g} {resource} but {where} has {have:g}: {fix}"
            )


def _rendezvous_address(loopback: bool) -> tuple[str, int]:
    """IP of this node (loopback: 127.0.0.1), and a free port there, for torch.distributed."""
    host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
    return host, rendezvous_port(host)


_rendezvous_address_there = ray.remote(num_cpus=0)(_rendezvous_address)


def _rank0_rendezvous_address(rank0_node: str, loopback: bool, strategy: Any) -> tuple[str, int]:
    """:func:`_rendezvous_address` of the node hosting rank 0: found in this process when that
    node is this driver's (every single-machine run), else by a task placed there (``strategy``),
    whose worker process would be started for this alone."""
    if rank0_node == ray.get_runtime_context().get_node_id():
        return _rendezvous_address(loopback)
    return ray.get(_rendezvous_address_there.options(scheduling_strategy=strategy).remote(loopback))


WORKER_ERROR_LOG = "worker_errors.log"
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Exit)): (.+)$")


def remote_error_line(cause: BaseException) -> str:
    """``Type: message`` of what failed inside the worker, in one line. Ray wraps some failures
    (an error in an actor's constructor) into an error whose text is the remote traceback: the
    last ``SomeError: message`` line of it is what the user needs."""
    text = str(cause).strip()
    if "\n" not in text and "Traceback" not in text:
        return f"{type(cause).__name__}: {text}"
    for line in reversed(text.splitlines()):
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            return f"{match.group(1)}: {match.group(2)}"
    return f"{type(cause).__name__}: {text.splitlines()[0]}"


class WorkerGroup(SPMDGroup):
    """``world_size`` actors of ``worker_cls`` on ``nnodes`` nodes, ``world_size / nnodes`` on
    each; rank ``r`` runs in placement-group bundle ``r`` (one node: one bundle per worker), or in
    the bundle of its node (several: one bundle per node, :mod:`polyrl.workers.nodes`);
    ``nodes`` lists each rank's node.

    Each actor is built as ``worker_cls(rank=r, world_size=n, master_addr=..., master_port=...,
    **init_kwargs)`` (the address and port are a free rendezvous point on rank 0's node for
    torch.distributed) and must have a ``ready()`` method; the group waits for all of them.
    ``cpus_per_worker`` is Ray's CPU reservation per actor (fractions are fine: the number of
    CPUs Ray was started with must cover ``world_size * cpus_per_worker``);
    ``threads_per_worker`` sets ``OMP_NUM_THREADS`` (default: one per GPU worker, the machine's
    cores shared evenly on CPU).
    """

    def __init__(
        self,
        worker_cls: type,
        *,
        world_size: int,
        device: str,
        init_kwargs: dict[str, Any],
        name: str = "global",
        ready_timeout_s: float = 1800.0,
        cpus_per_worker: float = 1.0,
        threads_per_worker: int | None = None,
        placement_timeout_s: float = 120.0,
        log_dir: str | None = None,
        nnodes: int = 1,
    ) -> None:
        self.name, self.world_size = name, world_size
        self.log_dir = log_dir
        self.workers: list[Any] = []
        self._broken = False
        resources: dict[str, float] = {"CPU": cpus_per_worker}
        if device == "cuda":
            resources["GPU"] = 1
        plan = plan_nodes(world_size, nnodes, resources)
        check_cluster_fits(plan.bundles, name)
        check_nodes_available(plan, name, alive_nodes())
        self.placement_group: Any = placement_group(plan.bundles, strategy=plan.strategy)
        try:
            ray.get(self.placement_group.ready(), timeout=placement_timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            remove_placement_group(self.placement_group)
            self.placement_group = None
            raise PolyrlError(
                f"Ray could not reserve {plan.describe()} for pool {name!r} within "
                f"{placement_timeout_s:.0f} s; the cluster has {ray.cluster_resources()} "
                f"(available now: {ray.available_resources()}). Lower trainer.n_gpus_per_node / "
                f"trainer.nnodes / trainer.resource_pools or add resources."
            ) from exc

        def strategy(rank: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group,
                placement_group_bundle_index=plan.bundle_of_rank[rank],
            )

        bundle_nodes = ray.util.placement_group_table(self.placement_group)["bundles_to_node_id"]
        self.nodes = placed_nodes(plan, bundle_nodes, alive_nodes())
        # Loopback only where no rank can be on another machine: the cluster this process started.
        master_addr, master_port = _rank0_rendezvous_address(
            self.nodes[0].node_id, device == "cpu" and _started_local_cluster, strategy(0)
        )
        remote_cls = ray.remote(worker_cls)
        options: dict[str, Any] = {"num_cpus": cpus_per_worker}
        if device == "cuda":
            options["num_gpus"] = 1
        if threads_per_worker is None:
            # On CPU the workers share the machine's cores: give each its share of threads
            # (Ray's default of one thread per actor would leave cores idle).
            threads_per_worker = 1 if device == "cuda" else (os.cpu_count() or 1) // world_size
        env = {
            "OMP_NUM_THREADS": str(max(1, threads_per_worker)),
            "MASTER_ADDR": master_addr,
            # transformers' per-load progress bars, repeated by every worker, would bury the
            # run's own progress display.
            "HF_HUB_DISABLE_PROGRESS_BARS": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
        }
        if device == "cpu":
            # DeepSpeed, imported by accelerate whenever a model is saved (even by the FSDP
            # engine), warns that it found no GPU unless it is told its accelerator.
            env["DS_ACCELERATOR"] = os.environ.get("DS_ACCELERATOR", "cpu")
        from polyrl.workers.transport import FAULT_ENV

        if FAULT_ENV in os.environ:
            # The weight-sync test hook reaches the workers on any cluster: those of a joined
            # one start from the cluster's environment, not this process's.
            env[FAULT_ENV] = os.environ[FAULT_ENV]
        self.workers = [
            remote_cls.options(
                scheduling_strategy=strategy(rank),
                runtime_env={"env_vars": env},
                **options,
            ).remote(
                rank=rank,
                world_size=world_size,
                master_addr=master_addr,
                master_port=master_port,
                **init_kwargs,
            )
            for rank in range(world_size)
        ]
        try:
            self._wait([w.ready.remote() for w in self.workers], "start", ready_timeout_s)
        except BaseException:
            self.shutdown()
            raise

    def _run(
        self,
        method: str,
        per_rank_args: Sequence[tuple[Any, ...]],
        *,
        what: str | None,
        timeout_s: float | None,
    ) -> list[Any]:
        # A batch several ranks receive (broadcast, or tensor-parallel peers of one dp rank)
        # goes into the object store once.
        stored: dict[int, Any] = {}

        def once(arg: Any) -> Any:
            if not isinstance(arg, Batch):
                return arg
            if id(arg) not in stored:
                stored[id(arg)] = ray.put(arg)
            return stored[id(arg)]

        with stop_signals_deferred():  # every rank gets the call, or none
            refs = [
                getattr(worker, method).remote(*(once(a) for a in args))
                for worker, args in zip(self.workers, per_rank_args)
            ]
        return self._wait(refs, what or method, timeout_s)

    def _wait(self, refs: list[Any], what: str, timeout_s: float | None) -> list[Any]:
        """All results, or the first failure at once (with its rank), or a timeout error naming
        the pending ranks; ``timeout_s`` bounds the whole call."""
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            if not done:
                self._broken = True
                raise WorkerError(
                    f"worker call {what!r} in pool {self.name!r} did not finish within "
                    f"{timeout_s} s on ranks {sorted(rank_of[p] for p in pending)}"
                )
            try:
                ray.get(done[0])
            except ray.exceptions.RayError as exc:
                self._broken = True
                cause = getattr(exc, "cause", None) or exc
                where = self._keep_traceback(str(exc))
                raise WorkerError(
                    f"{self._describe(rank_of[done[0]])} failed in {what!r}: "
                    f"{remote_error_line(cause)}{where}"
                ) from exc
        return ray.get(refs)

    def _keep_traceback(self, text: str) -> str:
        """Append the worker's whole traceback to ``<log_dir>/worker_errors.log`` (the temporary
        folder's when the run's disk is full, :func:`polyrl.run_log.keep`); the suffix that
        points the one-line message there (empty when it could be written nowhere)."""
        if not self.log_dir:
            return ""
        path = keep(f"pool {self.name}\n{text}", folder=self.log_dir, name=WORKER_ERROR_LOG)
        return f" (worker traceback in {path})" if path else ""

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop the actors (their ``shutdown()`` first, when the group has not failed: a rank
        stuck in a collective after a failure cannot shut down cleanly) and free the placement
        group. Safe to call twice."""
        if self.workers and not self._broken:
            with contextlib.suppress(PolyrlError, AttributeError):
                self._wait([w.shutdown.remote() for w in self.workers], "shutdown", timeout_s)
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        self.workers = []
        if self.placement_group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.placement_group)
            self.placement_group = None
