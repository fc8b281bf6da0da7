"""How a call splits its input over the workers of a role and gathers their outputs.

Pure functions over a *mesh*: one :class:`~polyrl.workers.mesh.DataParallelRank` per worker, in
worker-rank order (see :mod:`polyrl.workers.mesh`).

``DP_SPLIT``: the first argument (a :class:`~polyrl.batch.Batch`) is cut into ``dp_size`` equal
parts; every worker reporting data-parallel rank ``d`` gets part ``d`` (tensor- and
pipeline-parallel peers get the same rows). One output per dp rank is gathered (from the worker
that ``returns_output``), in dp-rank order: batches are concatenated, anything else (metrics
dicts) comes back as a list of one item per dp rank.
``BROADCAST``: every worker gets the same arguments; the list of all outputs comes back, in
worker-rank order.
``RANK_ZERO``: every worker gets the same arguments (collectives need all of them); only worker
rank 0's output comes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

from polyrl.workers.mesh import DataParallelRank, check_mesh


class Dispatch(str, Enum):
    DP_SPLIT = "dp_split"
    BROADCAST = "broadcast"
    RANK_ZERO = "rank_zero"


def split_args(
    mode: Dispatch, mesh: Sequence[DataParallelRank], args: tuple[Any, ...]
) -> list[tuple[Any, ...]]:
    """The argument tuple each worker receives, in worker-rank order."""
    if mode is Dispatch.DP_SPLIT:
        from polyrl.batch import Batch

        if not args or not isinstance(args[0], Batch):
            got = type(args[0]).__name__ if args else "no arguments"
            raise TypeError(f"a DP_SPLIT call needs a Batch as its first argument, got {got}")
        parts = args[0].chunk(check_mesh(mesh))
        return [(parts[position.dp_rank], *args[1:]) for position in mesh]
    return [args] * len(mesh)


def gather_outputs(
    mode: Dispatch,
    mesh: Sequence[DataParallelRank],
    outputs: Sequence[Any],
    pad_values: dict[str, int | float] | None = None,
) -> Any:
    """Combine the per-worker ``outputs`` (worker-rank order). ``pad_values`` right-pads
    batches of different widths per key (see :meth:`polyrl.batch.Batch.concat`)."""
    if len(outputs) != len(mesh):
        raise ValueError(f"{len(outputs)} outputs for a mesh of {len(mesh)} workers")
    if mode is Dispatch.DP_SPLIT:
        from polyrl.batch import Batch

        check_mesh(mesh)
        per_dp = _one_per_dp_rank(mesh, outputs)
        if per_dp and all(isinstance(o, Batch) for o in per_dp):
            return Batch.concat(per_dp, pad_values)
        return per_dp
    if mode is Dispatch.RANK_ZERO:
        return outputs[0]
    return list(outputs)


def _one_per_dp_rank(mesh: Sequence[DataParallelRank], outputs: Sequence[Any]) -> list[Any]:
    """The output of the worker returning each dp rank's result, in dp-rank order."""
    chosen: dict[int, Any] = {
        position.dp_rank: output
        for position, output in zip(mesh, outputs)
        if position.returns_output
    }
    return [chosen[dp_rank] for dp_rank in sorted(chosen)]
