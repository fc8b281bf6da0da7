"""The interface a training backend (FSDP2, Megatron, DeepSpeed ...) implements.

One engine instance per role (actor, reference, critic ...) lives in each worker process of the
role's pool, created after ``torch.distributed`` is initialised. Methods are SPMD: the controller
calls them on every worker at once, each data-parallel rank with its shard of the batch (see
:meth:`TrainingEngine.data_parallel_rank`).

Batch layout (a :class:`polyrl.batch.Batch`): ``input_ids[B, P+R]`` = left-padded prompt followed
by right-padded response, ``attention_mask[B, P+R]``, ``position_ids[B, P+R]``,
``responses[B, R]``, ``response_mask[B, R]``. Log-probs are of the ``R`` response tokens.

Two heads: a causal LM (actor, reference: :meth:`TrainingEngine.compute_log_prob`,
:meth:`TrainingEngine.train_step`) or a value model, one scalar per token on the same backbone
(a PPO critic: :meth:`TrainingEngine.compute_values`, :meth:`TrainingEngine.train_value_step`).
:attr:`EngineContext.head` says which to build. The value methods are optional: an engine that
implements them sets ``supports_value_head`` on its :class:`polyrl.specs.TrainingEngineSpec`, and
``polyrl validate`` refuses a critic on an engine without it.

LoRA (``actor_rollout_ref.model.lora_rank > 0``, for an engine whose spec sets ``supports_lora``):
the actor's engine trains adapters on frozen base weights; :meth:`TrainingEngine.named_weights`
then streams the merged model, :meth:`TrainingEngine.named_adapter_weights` the adapters, and
:meth:`TrainingEngine.adapters_disabled` gives the reference policy (see :mod:`polyrl.lora`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from polyrl.workers.mesh import DataParallelRank

if TYPE_CHECKING:
    import torch

    from polyrl.batch import Batch


class ModelHead(str, Enum):
    """What the engine puts on top of the backbone loaded from ``model_path``."""

    CAUSAL_LM = "causal_lm"  # next-token logits: log-probs of the responses (actor, reference)
    VALUE = "value"  # one scalar per token, a fresh head on the checkpoint's backbone (critic)


@dataclass
class EngineContext:
    """What a training engine is built from.

    ``model`` is the ``actor_rollout_ref.model`` config node; ``engine`` the engine node of the
    role, always shaped like ``actor_rollout_ref.actor`` (strategy, ``optim``, micro-batch sizes,
    ``fsdp_config`` ...): the actor's own, the reference's merged over it, and for a critic the
    actor's with the ``critic.*`` settings merged over it (see the critic role), so an engine
    reads one layout whatever the role. ``model_path`` is a local Hugging Face folder (polyrl
    converts GGUF files and resolves hub ids before this point); ``head`` what to build on it
    (a value head is initialised fresh, the backbone from the checkpoint, whatever head the
    checkpoint had).
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
    head: ModelHead = ModelHead.CAUSAL_LM


class MicroBatchLossFn(Protocol):
    """``(loss, metrics) = loss_fn(micro_batch, log_prob[b, R], entropy[b, R] | None)``.

    ``loss`` is already scaled so that summing it over the micro-batches of a mini-batch gives the
    mini-batch loss: the engine calls ``loss.backward()`` on each and steps once.

    The loss says what it needs instead of the engine reading algorithm keys: a loss that
    differentiates the entropy (an entropy bonus) sets the attribute ``needs_entropy_grad =
    True`` on itself, and the engine then hands it the entropy with its graph (see
    :func:`needs_entropy_grad`); otherwise the entropy arrives detached, for logging.
    """

    def __call__(
        self, micro_batch: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


def needs_entropy_grad(loss_fn: Any) -> bool:
    """Whether ``loss_fn`` (a :class:`MicroBatchLossFn`) differentiates the entropy."""
    return bool(getattr(loss_fn, "needs_entropy_grad", False))


class MicroBatchValueLossFn(Protocol):
    """``(loss, metrics) = loss_fn(micro_batch, values[b, R])``: a value head's micro-batch loss,
    scaled like :class:`MicroBatchLossFn`'s; ``values`` carry the gradient."""

    def __call__(
        self, micro_batch: Batch, values: torch.Tensor
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

    def compute_log_prob_and_sum_pi_squared(
        self, batch: Batch, *, temperature: float = 1.0, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """:meth:`compute_log_prob` plus ``sum_pi_squared`` ``[B, R]``: for each response token
        the sum over the vocabulary of the squared probabilities of the same tempered
        distribution (verl's ``actor.calculate_sum_pi_squared``), from the same forward pass.
        An engine that computes it overrides this, and its config check accepts
        ``actor_rollout_ref.actor.calculate_sum_pi_squared=true``."""
        raise NotImplementedError(
            f"{type(self).__name__} (role {self.ctx.role!r}) does not compute sum_pi_squared; "
            f"set actor_rollout_ref.actor.calculate_sum_pi_squared=false or use "
            f"actor_rollout_ref.actor.strategy=fsdp2"
        )

    @abstractmethod
    def train_step(
        self, mini_batch: Batch, loss_fn: MicroBatchLossFn, *, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step on ``mini_batch``: split into micro-batches (by count or token
        budget), forward with grad, ``loss_fn``, backward, clip, step the optimizer and LR
        schedule. Returns averaged ``loss_fn`` metrics plus ``actor/grad_norm`` (before clipping)
        and ``actor/lr``, verl's metric names."""

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Values ``[B, R]`` of a :attr:`ModelHead.VALUE` engine (no grad), zero on padding. The
        value of response token ``t`` is the head's output at the position that predicts it (the
        last prompt token for ``t = 0``), as for log-probs: the state in which ``t`` is chosen."""
        raise _no_value_head(self)

    def train_value_step(
        self, mini_batch: Batch, loss_fn: MicroBatchValueLossFn
    ) -> dict[str, float]:
        """One optimizer step of a :attr:`ModelHead.VALUE` engine, as :meth:`train_step` but with
        the values (with grad) handed to ``loss_fn``. Returns the averaged ``loss_fn`` metrics
        plus ``critic/grad_norm`` (before clipping) and ``critic/lr``, verl's names."""
        raise _no_value_head(self)

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Stream the full (unsharded) weights as ``(hf_name, tensor)`` pairs, one at a time, for
        weight sync into a rollout engine. Collective: every rank must iterate it to the end."""

    def named_adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Stream the full LoRA adapter tensors under peft's saved names
        (``base_model.model.<module>.lora_A.weight``), for a rollout engine that loads adapters
        (its spec sets ``supports_lora_adapters``). Collective, like :meth:`named_weights`."""
        raise _no_lora(self)

    def adapters_disabled(self) -> AbstractContextManager[None]:
        """A context inside which the engine computes with its LoRA adapters switched off: the
        base weights, which are a LoRA run's reference policy."""
        raise _no_lora(self)

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


def _no_lora(engine: TrainingEngine) -> NotImplementedError:
    return NotImplementedError(
        f"{type(engine).__name__} (role {engine.ctx.role!r}) trains no LoRA adapters; set "
        f"actor_rollout_ref.model.lora_rank > 0 on an engine whose spec sets supports_lora"
    )


def _no_value_head(engine: TrainingEngine) -> NotImplementedError:
    return NotImplementedError(
        f"{type(engine).__name__} has no value head; a critic needs an engine whose spec sets "
        f"supports_value_head"
    )
