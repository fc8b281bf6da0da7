"""What every worker group offers, whatever runs its workers (Ray actors or local threads).

A group runs ``world_size`` workers SPMD-style. :meth:`SPMDGroup.run` is the primitive: one
argument tuple per worker, every worker runs ``method`` at once, the outputs come back in rank
order, and the first failing rank raises :class:`WorkerError` at once (never a hang on ranks that
wait in a collective for the failed one). :meth:`SPMDGroup.call` adds dispatch
(:mod:`polyrl.workers.dispatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polyrl.errors import PolyrlError
from polyrl.workers.dispatch import Dispatch, gather_outputs, split_args
from polyrl.workers.mesh import DataParallelRank, trivial_mesh


class WorkerError(PolyrlError):
    """A worker raised, died or timed out; the message names the group, the rank(s) and the
    error."""


class SPMDGroup:
    """Base of :class:`~polyrl.workers.worker_group.WorkerGroup` (Ray) and
    :class:`~polyrl.workers.local.LocalWorkerGroup` (threads)."""

    name: str = "global"
    world_size: int = 0

    def run(
        self,
        method: str,
        per_rank_args: Sequence[tuple[Any, ...]],
        *,
        what: str | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """``method(*per_rank_args[r])`` on every rank ``r`` at once; the outputs in rank order.
        ``what`` names the call in errors (default: ``method``); ``timeout_s`` bounds the whole
        call (None: no limit)."""
        if len(per_rank_args) != self.world_size:
            raise ValueError(f"{len(per_rank_args)} argument tuples for {self.world_size} ranks")
        return self._run(method, per_rank_args, what=what, timeout_s=timeout_s)

    def _run(
        self,
        method: str,
        per_rank_args: Sequence[tuple[Any, ...]],
        *,
        what: str | None,
        timeout_s: float | None,
    ) -> list[Any]:
        """:meth:`run` once the argument tuples are known to be one per rank."""
        raise NotImplementedError

    def call(
        self,
        method: str,
        *args: Any,
        dispatch: Dispatch = Dispatch.BROADCAST,
        mesh: Sequence[DataParallelRank] | None = None,
        pad_values: dict[str, int | float] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Run ``method`` on every rank with the arguments ``dispatch`` gives it over ``mesh``
        (default: every rank its own data-parallel rank) and gather the outputs."""
        mesh = tuple(mesh) if mesh is not None else trivial_mesh(self.world_size)
        if len(mesh) != self.world_size:
            raise ValueError(f"a mesh of {len(mesh)} workers for a group of {self.world_size}")
        per_rank = split_args(dispatch, mesh, args)
        outputs = self.run(method, per_rank, timeout_s=timeout_s)
        return gather_outputs(dispatch, mesh, outputs, pad_values)

    def shutdown(self) -> None:
        raise NotImplementedError

    def _describe(self, rank: int) -> str:
        return f"worker rank {rank} of pool {self.name!r}"
