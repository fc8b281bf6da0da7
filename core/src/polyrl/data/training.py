"""What a run trains and validates on: the loader of the batches each step starts from, and the
validation the trainer runs every ``trainer.test_freq`` steps.

By default these are verl-format prompts and validation by generation and reward (built by the
trainer). An algorithm whose step starts from something else (offline DPO: preference pairs)
returns its own :class:`TrainingData` from ``AlgorithmSpec.data``; the training loop, the
checkpoints and the loggers stay the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from polyrl.batch import Batch
    from polyrl.step.context import StepContext


class BatchLoader(Protocol):
    """Batches epoch after epoch, resumable to the exact batch
    (:class:`polyrl.data.loader.PromptLoader` is one). ``len()`` is the number of batches per
    epoch, ``epoch`` the current one; ``next_batch(count)`` draws ``count`` items (default: the
    batch size) from the same stream; ``state_dict()`` goes into every checkpoint."""

    epoch: int

    def __len__(self) -> int: ...

    def next_batch(self, count: int | None = None) -> Batch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class ValidationResult:
    """What a validation that generates returns: its metrics and the samples picked for
    ``trainer.log_val_generations`` (rows of ``data_source``, ``prompt``, ``output`` and
    ``score``; the trainer stamps the step and sends them to the loggers). A validation that
    shows no samples (DPO's, on fixed pairs) returns its metrics dict alone."""

    metrics: dict[str, float]
    generations: list[dict[str, Any]] = field(default_factory=list)


#: ``validate(ctx) -> metrics``: runs on the driver with the step's context (workers, tokenizer,
#: reward); metrics named ``val-core/...`` (headline figures) and ``val-aux/...``, alone or in a
#: :class:`ValidationResult` with the samples to log.
Validation = Callable[["StepContext"], "dict[str, float] | ValidationResult"]


@dataclass
class TrainingData:
    """The training batches (``loader``), the validation (None: the run has none), and the
    ``data_source`` values of both sets' rows (None: not known)."""

    loader: BatchLoader
    validate: Validation | None = None
    data_sources: frozenset[str] | None = None


def training_data_from_files(
    cfg: Any,
    tokenizer: Any,
    dataset: Callable[[list[str], Any, Any], Any],
    loader: Callable[..., BatchLoader],
    validate: Callable[[Any, StepContext], dict[str, float] | ValidationResult],
) -> TrainingData:
    """``dataset(files, tokenizer, cfg.data)`` of ``data.train_files`` in a
    ``loader(train_set, data.train_batch_size, shuffle=, seed=)`` (with ``data.sampler``, a
    :class:`polyrl.data.sampler.SamplerLoader` in the order of the user's sampler); with
    ``data.val_files``, the validation ``validate(val_set, ctx)`` on ``dataset`` of those."""
    from functools import partial

    from polyrl.data.sources import resolve_data_files

    train_set = dataset(resolve_data_files(cfg.data.train_files, "train"), tokenizer, cfg.data)
    batches = _sampled(cfg, loader, train_set) or loader(
        train_set,
        int(cfg.data.train_batch_size),
        shuffle=bool(cfg.data.shuffle),
        seed=int(cfg.data.seed),
    )
    if not cfg.data.val_files:
        return TrainingData(batches, data_sources=_data_sources(train_set))
    val_set = dataset(resolve_data_files(cfg.data.val_files, "val"), tokenizer, cfg.data)
    sources = _data_sources(train_set, val_set)
    return TrainingData(batches, partial(validate, val_set), data_sources=sources)


def _data_sources(*datasets: Any) -> frozenset[str] | None:
    """The ``data_source`` of every row of ``datasets``; None when one of them does not hold
    its rows as :class:`polyrl.data.dataset.PromptItem` (a dataset of its own kind)."""
    sources: set[str] = set()
    for data in datasets:
        items = getattr(data, "items", None)
        if not isinstance(items, list):
            return None
        sources.update(str(getattr(item, "data_source", "")) for item in items)
    return frozenset(sources)


def _sampled(cfg: Any, loader: Callable[..., BatchLoader], train_set: Any) -> BatchLoader | None:
    """verl's ``data.sampler`` over the prompts (None when unset). Only prompt batches are
    drawn by a sampler: an algorithm whose data loader is its own is refused one."""
    from polyrl.data.loader import PromptLoader
    from polyrl.data.sampler import SamplerLoader, build_sampler
    from polyrl.errors import ConfigError

    if cfg.data.sampler.class_path is None:
        return None
    if loader is not PromptLoader:
        raise ConfigError(
            f"data.sampler orders prompt batches; this algorithm loads its data with "
            f"{getattr(loader, '__name__', loader)}: unset data.sampler.class_path"
        )
    return SamplerLoader(
        train_set, int(cfg.data.train_batch_size), sampler=build_sampler(cfg.data, train_set)
    )
