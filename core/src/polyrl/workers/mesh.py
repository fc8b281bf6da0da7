"""Where a worker sits in its role's data-parallel mesh.

Every worker of a pool hosts one rank of each of its roles. A role's engine may shard the model
over several workers (tensor or pipeline parallelism): those peers form ONE data-parallel rank,
must receive the same rows, and only one of them returns the output. Each role reports its
position as a :class:`DataParallelRank`; the driver collects them per role (the role's mesh, in
worker-rank order) and dispatches by it (:mod:`polyrl.workers.dispatch`).

Light on purpose (no torch): the engine interfaces import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polyrl.errors import PolyrlError


class MeshError(PolyrlError):
    """The data-parallel positions the workers of a role report do not form a valid mesh."""


@dataclass(frozen=True)
class DataParallelRank:
    """``dp_rank`` of ``dp_size`` data-parallel ranks; ``returns_output``: this worker's result is
    the one gathered for its dp rank (exactly one worker per dp rank says so)."""

    dp_rank: int
    dp_size: int
    returns_output: bool = True


def trivial_mesh(world_size: int) -> tuple[DataParallelRank, ...]:
    """Every worker its own data-parallel rank (no tensor or pipeline parallelism)."""
    return tuple(DataParallelRank(rank, world_size, True) for rank in range(world_size))


def tensor_parallel_mesh(rank: int, world_size: int, model_parallel: int) -> DataParallelRank:
    """The position of ``rank`` when consecutive groups of ``model_parallel`` ranks hold the
    shards of one model (tensor or pipeline parallelism): group ``rank // model_parallel`` is
    one data-parallel rank, and its first member returns the output."""
    if model_parallel < 1 or world_size % model_parallel:
        raise MeshError(
            f"{world_size} workers cannot form groups of {model_parallel} model-parallel ranks: "
            f"the tensor/pipeline-parallel size must divide the number of workers"
        )
    return DataParallelRank(
        dp_rank=rank // model_parallel,
        dp_size=world_size // model_parallel,
        returns_output=rank % model_parallel == 0,
    )


def check_mesh(mesh: Sequence[DataParallelRank], role: str = "") -> int:
    """The mesh's ``dp_size``, after checking that all workers agree on it, that every dp rank
    ``0 .. dp_size-1`` has at least one worker and exactly one worker returning its output."""
    what = f"role {role!r}" if role else "the group"
    if not mesh:
        raise MeshError(f"{what} has no workers")
    sizes = {position.dp_size for position in mesh}
    if len(sizes) != 1:
        raise MeshError(
            f"the workers of {what} disagree on the data-parallel size: "
            f"{[p.dp_size for p in mesh]} (worker rank order)"
        )
    dp_size = sizes.pop()
    if dp_size < 1:
        raise MeshError(f"{what} reports a data-parallel size of {dp_size}")
    problems = []
    for position in mesh:
        if not 0 <= position.dp_rank < dp_size:
            problems.append(f"a dp_rank of {position.dp_rank} outside 0..{dp_size - 1}")
    for dp_rank in range(dp_size):
        workers = [w for w, p in enumerate(mesh) if p.dp_rank == dp_rank]
        returning = [w for w in workers if mesh[w].returns_output]
        if not workers:
            problems.append(f"no worker for dp rank {dp_rank}")
        elif len(returning) != 1:
            problems.append(
                f"dp rank {dp_rank} (workers {workers}) has {len(returning)} workers returning "
                f"output (workers {returning}); exactly one must"
            )
    if problems:
        raise MeshError(
            f"the data-parallel mesh of {what} is invalid: {'; '.join(problems)}; reported "
            f"(worker rank order): {[(p.dp_rank, p.dp_size, p.returns_output) for p in mesh]}"
        )
    return dp_size
