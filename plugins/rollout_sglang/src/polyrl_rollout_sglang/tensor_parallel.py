"""How polyrl's workers form one tensor-parallel SGLang engine.

polyrl gives every worker exactly one GPU. A tensor-parallel SGLang engine spans ``tp``
consecutive workers, each of them one SGLang "node" of one GPU (``nnodes=tp``,
``node_rank=rank % tp``): each worker's ``sglang.Engine`` starts the scheduler of its own shard on
its own GPU, and the first worker of the group, the *leader* (node 0), owns the tokenizer side
that takes requests, weight updates and memory release for the whole engine. The peers only
exchange a few objects with their leader over the workers' process group
(:class:`EngineGroup`): the leader's rendezvous address at start, their serialized weight
handles during a sync, the leader's verdict after each step of a sync, and the leader's samples
after a generation.

torch.distributed is imported only when an engine spans several workers.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from polyrl.api import DataParallelRank, PolyrlError, tensor_parallel_mesh

# SGLang's leader listens on its rendezvous port and the next few (tokenizer, detokenizer, rpc,
# scheduler input ...): keep this many consecutive ports free.
LEADER_PORT_SPAN = 8


@dataclass(frozen=True)
class TensorParallelPlacement:
    """Worker ``rank`` of ``world_size`` in an engine of ``size`` consecutive workers."""

    rank: int
    world_size: int
    size: int

    def __post_init__(self) -> None:
        tensor_parallel_mesh(self.rank, self.world_size, self.size)  # raises on a bad layout

    @property
    def node_rank(self) -> int:
        """This worker's SGLang node (its shard) in the engine; 0 is the leader."""
        return self.rank % self.size

    @property
    def leader(self) -> int:
        """The worker rank of the engine's leader."""
        return self.rank - self.node_rank

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0

    @property
    def dp_rank(self) -> int:
        """The engine's data-parallel rank: engines are numbered by their leader."""
        return self.rank // self.size

    def data_parallel_rank(self) -> DataParallelRank:
        """All workers of one engine are one data-parallel rank; the leader returns the output."""
        return tensor_parallel_mesh(self.rank, self.world_size, self.size)


class EngineGroup:
    """The workers of one engine, for the objects they exchange. For a one-GPU engine every
    exchange is local (no process group is needed or touched)."""

    def __init__(self, placement: TensorParallelPlacement, process_group: Any = None) -> None:
        self.placement = placement
        self.process_group = process_group

    @classmethod
    def join(cls, placement: TensorParallelPlacement) -> EngineGroup:
        """Make the subgroup of every engine (all workers must call this together, as
        torch.distributed requires) and keep this worker's."""
        if placement.size == 1:
            return cls(placement)
        import torch.distributed as dist

        if not dist.is_initialized():
            raise PolyrlError(
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={placement.size} joins "
                f"the workers of one SGLang engine through their process group, which is not "
                f"initialized here; run under polyrl's workers (polyrl train) or set it to 1"
            )
        mine = None
        for leader in range(0, placement.world_size, placement.size):
            group = dist.new_group(list(range(leader, leader + placement.size)))
            if leader == placement.leader:
                mine = group
        return cls(placement, mine)

    def gather(self, obj: Any) -> list[Any] | None:
        """``obj`` of every worker of the engine at the leader (in node order); None elsewhere."""
        if self.placement.size == 1:
            return [obj]
        import torch.distributed as dist

        gathered = [None] * self.placement.size if self.placement.is_leader else None
        dist.gather_object(obj, gathered, dst=self.placement.leader, group=self.process_group)
        return gathered

    def broadcast(self, obj: Any) -> Any:
        """The leader's ``obj`` on every worker of the engine (the others pass anything)."""
        if self.placement.size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=self.placement.leader, group=self.process_group)
        return box[0]


def free_port(span: int = 1) -> int:
    """The first of ``span`` consecutive TCP ports that are free now. The operating system
    picks the first (it hands out each one in turn, so workers starting at the same moment get
    different ones); SGLang derives a few more ports from a leader's rendezvous port."""
    for _ in range(32):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            first = int(sock.getsockname()[1])
        if first + span <= 65536 and all(_bindable(p) for p in range(first + 1, first + span)):
            return first
    raise PolyrlError(f"found no {span} consecutive free TCP ports on this machine")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def reachable_host(master_addr: str | None) -> str:
    """The address of this machine on the interface that reaches ``master_addr`` (the workers'
    rendezvous host, so the engine's other workers can reach it too); loopback without one.
    Connecting a UDP socket sends nothing: it only picks the route."""
    if not master_addr:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((master_addr, 9))
            return str(sock.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def leader_address() -> str:
    """``host:port`` where an engine's leader waits for its peers' schedulers."""
    host = reachable_host(os.environ.get("MASTER_ADDR"))
    return f"{host}:{free_port(LEADER_PORT_SPAN)}"
