"""The interface a training backend (FSDP2, Megatron, DeepSpeed ...) implements.

One engine instance per role (actor, reference, critic ...) lives in each worker process of the
role's pool, created after ``torch.distributed`` is initialised. Methods are SPMD: the controller
calls them on every worker at once, each data-parallel rank with its shard of the batch (see
:meth:`TrainingEngine.data_parallel_rank`).

Batch layout (a :class:`polyrl.batch.Batch`): ``input_ids[B, P+R]`` = left-padded prompt followed
by right-padded response, ``attention_mask[B, P+R]``, ``position_ids[B, P+R]``,
``responses[B, R]``, ``response_mask[B, R]``. Log-probs are of the ``R`` response tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from polyrl.workers.mesh import DataParallelRank

if TYPE_CHECKING:
    import torch

    from polyrl.batch import Batch


@dataclass
class EngineContext:
    """What a training engine is built from.

    ``model`` is the ``actor_rollout_ref.model`` config node; ``engine`` the node of the role
    (``actor_rollout_ref.actor`` for the actor and the reference, ``critic`` for a critic):
    strategy, ``optim``, micro-batch sizes, ``fsdp_config`` ... ``model_path`` is a local
    Hugging Face folder (polyrl converts GGUF files and resolves hub ids before this point).
    """

    role: str
    model_path: str
    model: Any
    engine: Any
    device: str
    rank: int
    world_size: int
    seed: int = 0
    total_training_steps: int = 1
    trainable: bool = True


class MicroBatchLossFn(Protocol):
    """``(loss, metrics) = loss_fn(micro_batch, log_prob[b, R], entropy[b, R] | None)``.

    ``loss`` is already scaled so that summing it over the micro-batches of a mini-batch gives the
    mini-batch loss: the engine calls ``loss.backward()`` on each and steps once.
    """

    def __call__(
        self, micro_batch: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


class TrainingEngine(ABC):
    """One worker's part of a training backend."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx

    def data_parallel_rank(self) -> DataParallelRank:
        """This worker's data-parallel position: the driver gives every worker of one
        ``dp_rank`` the same rows and gathers the output of the one that ``returns_output``.

        The default makes every worker its own data-parallel rank. An engine that shards the
        model over workers (tensor or pipeline parallelism) overrides it: its TP/PP peers report
        the same ``dp_rank`` and only one of them returns output.
        """
        return DataParallelRank(
            dp_rank=self.ctx.rank, dp_size=self.ctx.world_size, returns_output=True
        )

    @abstractmethod
    def compute_log_prob(
        self, batch: Batch, *, temperature: float = 1.0, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs ``[B, R]`` of ``batch['responses']`` under the current weights (no grad),
        and the per-token entropy when asked. Logits are divided by ``temperature`` first, as in
        sampling."""

    @abstractmethod
    def train_step(
        self, mini_batch: Batch, loss_fn: MicroBatchLossFn, *, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step on ``mini_batch``: split into micro-batches (by count or token
        budget), forward with grad, ``loss_fn``, backward, clip, step the optimizer and LR
        schedule. Returns averaged ``loss_fn`` metrics plus ``actor/grad_norm`` (before clipping)
        and ``actor/lr``, verl's metric names."""

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Stream the full (unsharded) weights as ``(hf_name, tensor)`` pairs, one at a time, for
        weight sync into a rollout engine. Collective: every rank must iterate it to the end."""

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Write model, optimizer, LR schedule and RNG state under ``path`` (collective)."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (collective)."""

    @abstractmethod
    def export_hf(self, path: str) -> None:
        """Write the model as a Hugging Face folder ``transformers`` can load (collective; rank 0
        writes)."""
