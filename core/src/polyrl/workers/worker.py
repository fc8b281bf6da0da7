"""The worker process: one per device of a resource pool, hosting the roles of that pool.

It joins the pool's torch.distributed group (the engines of all its roles share it), discovers
plugins itself (it is a separate process), builds the roles it is given and serves the driver's
calls by role name. Roles of one pool are colocated: the actor's weights reach the rollout engine
of the same process as an in-memory stream (:meth:`Worker.sync_weights`). Between pools (the
rollout in a pool of its own) they travel over a transport channel, a second process group that
spans the actor's rank 0 and the rollout workers (:mod:`polyrl.workers.transport`; the driver's
side is :mod:`polyrl.workers.weight_sync`).

The step decides which roles exist (:mod:`polyrl.step`); nothing here knows an algorithm.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from omegaconf import OmegaConf

from polyrl.errors import PolyrlError
from polyrl.specs import resolve_object
from polyrl.workers import transport
from polyrl.workers.buckets import unpack_buckets
from polyrl.workers.mesh import DataParallelRank
from polyrl.workers.rendezvous import rendezvous_store
from polyrl.workers.roles import CORE_ROLES, Role, RoleContext
from polyrl.workers.worker_plan import WorkerPlan


class RoleError(PolyrlError):
    """A role is unknown, not hosted by this worker, or cannot do what it was asked."""


def resolve_role_class(role: str, role_classes: Mapping[str, type | str] | None = None) -> type:
    """The class of ``role``: ``role_classes`` (an algorithm's ``AlgorithmSpec.role_classes``)
    first, then core's ``actor``, ``ref`` and ``rollout``."""
    role_classes = role_classes or {}
    target = role_classes.get(role) or CORE_ROLES.get(role)
    if target is None:
        raise RoleError(
            f"no class for the worker role {role!r}: core provides {sorted(CORE_ROLES)}; an "
            f"algorithm that uses another role must name its class in AlgorithmSpec.role_classes"
            f" (given: {sorted(role_classes)})"
        )
    cls = resolve_object(target)
    if not (isinstance(cls, type) and issubclass(cls, Role)):
        raise RoleError(
            f"the class of worker role {role!r} ({target!r}) is not a subclass of "
            f"polyrl.workers.roles.Role"
        )
    return cls


class Worker:
    """Serves one rank of a pool; every public method is called on all ranks at once."""

    def __init__(
        self,
        cfg: Any,
        roles: Sequence[str],
        role_classes: Mapping[str, type | str] | None = None,
        *,
        plan: WorkerPlan | None = None,
        rank: int,
        world_size: int,
        model_path: str = "",
        total_training_steps: int = 1,
        tokens: dict[str, Any] | None = None,
        pool: str = "global",
        master_addr: str | None = None,
        master_port: int | None = None,
    ) -> None:
        self.cfg = OmegaConf.create(cfg)
        self.rank, self.world_size, self.pool = rank, world_size, pool
        self.device = str(self.cfg.trainer.device)
        # without an address the worker uses the process group its process already has (the
        # in-process backend's pools beyond the first share the first one's group of one)
        self._joined = master_port is not None
        if self._joined:
            self._join_process_group(str(master_addr), int(master_port))
        self.roles: dict[str, Role] = {}
        self.weight_versions: dict[str, int] = {}  # role -> version of its last weight sync
        # the weight channel to/from another pool, and its rendezvous (on the channel's root)
        self._channel: transport.Channel | None = None
        self._channel_store: Any = None
        plan = plan or WorkerPlan(role_classes=dict(role_classes or {}))
        for name in roles:
            cls = resolve_role_class(name, {**plan.role_classes, **(role_classes or {})})
            ctx = RoleContext(
                role=name,
                cfg=self.cfg,
                model_path=model_path,
                rank=rank,
                world_size=world_size,
                device=self.device,
                total_training_steps=total_training_steps,
                tokens=dict(tokens or {}),
                peers=self.roles,
                plan=plan,
            )
            try:
                self.roles[name] = cls(ctx)
            except Exception as exc:
                raise RoleError(
                    f"building role {name!r} ({cls.__module__}.{cls.__qualname__}) in pool "
                    f"{pool!r} failed: {type(exc).__name__}: {exc}"
                ) from exc

    def _join_process_group(self, master_addr: str, master_port: int) -> None:
        import torch
        import torch.distributed as dist

        timeout = timedelta(seconds=float(self.cfg.trainer.collective_timeout_s))
        store = rendezvous_store(master_addr, master_port, self.rank, self.world_size, timeout)
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(store.port),  # the bound one where master_port is 0
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
        )
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray exposes exactly one GPU to this actor
        elif os.environ.get("OMP_NUM_THREADS"):  # a Ray worker's share of the cores
            torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
        dist.init_process_group(
            backend="nccl" if self.device == "cuda" else "gloo",
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )

    def ready(self) -> int:
        return self.rank

    def _role(self, role: str) -> Role:
        if role not in self.roles:
            raise RoleError(
                f"role {role!r} is not hosted by pool {self.pool!r} (it hosts {sorted(self.roles)})"
            )
        return self.roles[role]

    # ---- driver calls ------------------------------------------------------------------------
    def mesh(self, role: str) -> DataParallelRank:
        """This worker's data-parallel position for ``role``."""
        return self._role(role).data_parallel_rank()

    def call(self, role: str, method: str, *args: Any) -> Any:
        """``role.method(*args)``: any public method of the role."""
        target = self._role(role)
        function = None if method.startswith("_") else getattr(target, method, None)
        if not callable(function):
            public = sorted(
                name
                for name in dir(target)
                if not name.startswith("_") and callable(getattr(target, name, None))
            )
            raise RoleError(
                f"role {role!r} ({type(target).__name__}) has no method {method!r}; its methods: "
                f"{public}"
            )
        return function(*args)

    def sync_weights(
        self, source: str, target: str, version: int | None = None
    ) -> dict[str, float]:
        """Stream the full weights of ``source`` into ``target`` (both in this process, no
        disk round trip); the bytes moved and the seconds it took. ``version`` (the driver's
        sync count) is recorded for ``target``."""
        src, dst = self._role(source), self._role(target)
        start = time.perf_counter()
        moved = 0

        def stream():
            nonlocal moved
            for name, tensor in src.named_weights():
                moved += tensor.numel() * tensor.element_size()
                yield name, tensor

        if version is not None:
            self._check_version(target, version)
        dst.update_weights(stream())
        if version is not None:
            self.weight_versions[target] = version
        return {"bytes": float(moved), "seconds": time.perf_counter() - start}

    # ---- weight transport between pools ------------------------------------------------------
    def open_weight_channel(self, timeout_s: float) -> tuple[str, int] | None:
        """On rank 0 (the channel's root): a fresh TCPStore on a free port of this node,
        ``(host, port)``; None on the other ranks."""
        if self.rank != 0:
            return None
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        self._channel_store, port = transport.serve_store(host, timeout_s)
        return host, port

    def join_weight_channel(
        self, address: tuple[str, int], channel_rank: int | None, size: int, timeout_s: float
    ) -> None:
        """Join the channel at ``address`` as ``channel_rank`` of ``size`` (None: this worker
        is not in it; the actor's ranks other than 0 only help gather)."""
        if channel_rank is None:
            return
        host, port = address
        self._channel = transport.Channel(
            host, port, channel_rank, size, self.device, timeout_s, store=self._channel_store
        )

    def send_weights(self, source: str, version: int, bucket_bytes: int) -> dict[str, float]:
        """Gather ``source``'s full weights (every rank: the gather is collective) and broadcast
        them from the channel's root; the bytes sent and the seconds it took."""
        start = time.perf_counter()
        stream = self._role(source).named_weights()
        if self._channel is None:
            for _ in stream:
                pass
            return {"bytes": 0.0, "seconds": time.perf_counter() - start}
        sent = transport.send(self._channel, stream, version, bucket_bytes)
        return {"bytes": float(sent), "seconds": time.perf_counter() - start}

    def receive_weights(self, target: str, version: int) -> dict[str, float]:
        """Load the weights of sync ``version`` from the channel into ``target``; records the
        version and returns it with the bytes received and the seconds it took."""
        if self._channel is None:
            raise RoleError(f"rank {self.rank} of pool {self.pool!r} has no weight channel")
        self._check_version(target, version)
        start = time.perf_counter()
        received = 0

        def buckets():
            nonlocal received
            for bucket in transport.receive(self._channel, version):
                received += bucket.buffer.numel()
                yield bucket

        self._role(target).update_weights(unpack_buckets(buckets()))
        self.weight_versions[target] = version
        return {
            "bytes": float(received),
            "seconds": time.perf_counter() - start,
            "version": float(version),
        }

    def _check_version(self, target: str, version: int) -> None:
        last = self.weight_versions.get(target, 0)
        if version <= last:
            raise transport.WeightSyncError(
                f"weight sync: version {version} for role {target!r} on rank {self.rank} of "
                f"pool {self.pool!r} is not newer than the version it has ({last})"
            )

    # ---- checkpoints, export, shutdown -------------------------------------------------------
    def save_checkpoint(self, directory: str) -> list[str]:
        """Each role with a checkpoint writes ``directory/<role>``; the roles saved."""
        saved = []
        for name, role in self.roles.items():
            if role.checkpointed:
                role.save_checkpoint(os.path.join(directory, name))
                saved.append(name)
        return saved

    def load_checkpoint(self, directory: str) -> list[str]:
        """Restore each role with a checkpoint from ``directory/<role>``, then stream the
        actor's weights into a colocated rollout; the roles loaded."""
        loaded = []
        for name, role in self.roles.items():
            if not role.checkpointed:
                continue
            path = os.path.join(directory, name)
            if not os.path.isdir(path):
                raise RoleError(
                    f"the checkpoint {directory} has no folder {name!r} for role {name!r} "
                    f"(it has {sorted(os.listdir(directory)) if os.path.isdir(directory) else []})"
                    f"; resume from a checkpoint written by a run with the same roles"
                )
            role.load_checkpoint(path)
            loaded.append(name)
        if "actor" in self.roles and "rollout" in self.roles:
            self.sync_weights("actor", "rollout")
        return loaded

    def export_hf(self, directory: str, role: str = "actor") -> None:
        """Write ``role``'s model as a Hugging Face folder (collective; rank 0 writes)."""
        self.call(role, "export_hf", directory)

    def shutdown(self) -> None:
        """Shut every role down (last built first), then leave the process group."""
        errors = []
        for name in reversed(list(self.roles)):
            try:
                self.roles[name].shutdown()
            except Exception as exc:  # noqa: BLE001 - every role gets its chance, then re-raise
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
        import torch.distributed as dist

        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._channel_store = None
        if self._joined and dist.is_initialized():
            dist.destroy_process_group()
        if errors:
            raise RoleError(f"shutting roles down on rank {self.rank} failed: {errors}")
