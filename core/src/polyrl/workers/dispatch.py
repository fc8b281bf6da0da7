"""How a worker-group call splits its input over ranks and gathers the outputs.

``DP_SPLIT``: the first argument (a :class:`~polyrl.batch.Batch`) is cut into ``world_size``
equal parts, rank ``r`` gets part ``r``; the outputs (batches) are concatenated in rank order.
``BROADCAST``: every rank gets the same arguments; the list of outputs comes back.
``RANK_ZERO``: every rank gets the same arguments (collectives need all ranks), only rank 0's
output comes back.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class Dispatch(str, Enum):
    DP_SPLIT = "dp_split"
    BROADCAST = "broadcast"
    RANK_ZERO = "rank_zero"


def split_args(mode: Dispatch, world_size: int, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The argument tuple each rank receives."""
    if mode is Dispatch.DP_SPLIT:
        if not args:
            raise ValueError("a DP_SPLIT call needs a batch as its first argument")
        parts = args[0].chunk(world_size)
        return [(part, *args[1:]) for part in parts]
    return [args] * world_size


def gather_outputs(mode: Dispatch, outputs: list[Any]) -> Any:
    """Combine the per-rank outputs."""
    if mode is Dispatch.DP_SPLIT:
        from polyrl.batch import Batch

        if all(isinstance(o, Batch) for o in outputs):
            return Batch.concat(outputs)
        return outputs
    if mode is Dispatch.RANK_ZERO:
        return outputs[0]
    return outputs
