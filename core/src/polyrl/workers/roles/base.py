"""The base of every worker role: one job (actor, reference, rollout, critic ...) on one worker.

A :class:`~polyrl.workers.worker.Worker` builds the roles its pool hosts from a
:class:`RoleContext` each, and the driver calls their public methods by role name
(``workers.call("ref", "compute_log_prob", batch)``). A role holds no algorithm logic: what to
compute and when is the step's business (:mod:`polyrl.step`); a role runs its engine.

Plugins bring roles beyond core's ``actor``, ``ref`` and ``rollout`` by subclassing
:class:`Role` and naming the class in their ``AlgorithmSpec.role_classes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from polyrl.workers.mesh import DataParallelRank
from polyrl.workers.worker_plan import WorkerPlan

if TYPE_CHECKING:
    import torch


@dataclass
class RoleContext:
    """What a role is built from.

    ``cfg`` is the whole run config (an OmegaConf node, read-only); ``rank`` and ``world_size``
    are the worker's position in its pool (the torch.distributed group the role's engine
    shares with the other roles of the pool); ``tokens`` holds ``pad_token_id`` and
    ``eos_token_ids`` of the tokenizer. ``plan`` is the worker's part of the run plan: a role
    loads the plugins it builds (engines, losses) from it (``ctx.plan.load(kind, name)``),
    never from a registry. ``peers`` are the roles of the same worker by name (all of them once
    the worker is built), for a role that computes with another's engine: a LoRA
    run's reference is the actor's model with the adapters off.
    """

    role: str
    cfg: Any
    model_path: str
    rank: int
    world_size: int
    device: str
    total_training_steps: int = 1
    tokens: dict[str, Any] = field(default_factory=dict)
    peers: Mapping[str, Role] = field(default_factory=dict)
    plan: WorkerPlan = field(default_factory=WorkerPlan)

    @property
    def pad_token_id(self) -> int:
        return int(self.tokens.get("pad_token_id") or 0)


class Role:
    """One role on one worker.

    Subclasses set ``checkpointed = True`` and implement :meth:`save_checkpoint` /
    :meth:`load_checkpoint` when the role has state to resume (its own folder
    ``<checkpoint>/<role>``). A role whose weights feed another role (the actor into the
    rollout) implements :meth:`named_weights`; a role that receives them, :meth:`update_weights`.
    """

    checkpointed: ClassVar[bool] = False

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx

    @property
    def name(self) -> str:
        return self.ctx.role

    def data_parallel_rank(self) -> DataParallelRank:
        """This worker's data-parallel position for this role; roles with an engine delegate to
        it (a tensor-parallel engine makes its TP peers one dp rank)."""
        return DataParallelRank(self.ctx.rank, self.ctx.world_size, True)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError(f"role {self.name!r} ({type(self).__name__}) has no weights")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError(
            f"role {self.name!r} ({type(self).__name__}) does not take weights"
        )

    def save_checkpoint(self, path: str) -> None:
        """Write this role's state under ``path`` (collective over the pool)."""

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (collective over the pool)."""

    def shutdown(self) -> None:
        """Release the role's resources at the end of the run."""
