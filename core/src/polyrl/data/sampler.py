"""verl's custom samplers: ``data.sampler.class_path`` / ``data.sampler.class_name``.

The class is loaded as verl loads it (``pkg://dotted.module`` or ``pkg://dotted/module``
imports a module; ``file://path.py`` or a plain path loads a file) and built as
``cls(data_source=<the train dataset>, data_config=<the data section>)``. It must be iterable
(dataset positions, one pass per epoch) and sized. The prompt batches then come from it
(:class:`SamplerLoader`, in place of ``data.shuffle``'s order), drawn as each step starts.

A curriculum sampler (one with ``update(batch)``, verl's ``AbstractCurriculumSampler``) is told
each finished training step's batch (:func:`after_step`): polyrl's :class:`polyrl.batch.Batch`
(``batch["data_source"]``, ``batch["token_level_scores"]`` ...), where verl passes its
``DataProto``. A sampler that iterates lazily sees that before the next batch is drawn.

Resume stays exact only if the sampler can say where it stands: with ``state_dict()`` and
``load_state_dict(state)`` (torchdata's stateful-sampler convention: after loading, ``iter()``
yields the rest of the pass the state was taken in, and the state holds the curriculum's own
too) its state goes into every checkpoint; without them, resuming is refused in one line
instead of silently drawing other prompts than the interrupted run would have.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from polyrl.data.loader import PromptLoader
from polyrl.data.user_code import class_problems, load_user_class
from polyrl.errors import ConfigError, DataError

KEY = "data.sampler"


def sampler_problems(sampler: Any) -> list[str]:
    """What is wrong with the ``data.sampler`` node, found without running the user's code."""
    return class_problems(KEY, "class_path", "class_name", sampler, "data.shuffle's order")


def build_sampler(data_config: Any, dataset: Any) -> Any:
    """The user's sampler over ``dataset``, built as verl builds it."""
    node = data_config.sampler
    cls = load_user_class(f"{KEY}.class_path", str(node.class_path), str(node.class_name))
    instance = cls(data_source=dataset, data_config=data_config)
    if not (hasattr(instance, "__iter__") and hasattr(instance, "__len__")):
        raise ConfigError(
            f"{KEY}.class_name={node.class_name!r} must be a sampler (iterable over dataset "
            "positions, with a length), like torch's Sampler"
        )
    return instance


class SamplerLoader(PromptLoader):
    """Prompt batches in the order the user's ``sampler`` gives, one pass per epoch; the
    incomplete tail of a pass is dropped, as with ``drop_last``."""

    def __init__(self, dataset: Any, batch_size: int, *, sampler: Any) -> None:
        super().__init__(dataset, batch_size, shuffle=False)
        self.user_sampler = sampler  # not `sampler`: that name reads as the config group
        self._pass: Iterator[Any] | None = None

    def __len__(self) -> int:
        return len(self.user_sampler) // self.batch_size

    def next_indices(self, count: int | None = None) -> list[int]:
        count = self.batch_size if count is None else int(count)
        if self._pass is None:
            self._pass = iter(self.user_sampler)
        chosen = self._take(count)
        if len(chosen) < count:  # the pass ran out: the next epoch's first batch
            self.epoch += 1
            self.position = 0
            self._pass = iter(self.user_sampler)
            chosen = self._take(count)
            if len(chosen) < count:
                raise DataError(
                    f"{KEY}.class_name={type(self.user_sampler).__name__} yields {len(chosen)} "
                    f"prompts per pass, fewer than a batch of {count}"
                )
        self.position += count
        return chosen

    def _take(self, count: int) -> list[int]:
        assert self._pass is not None
        return [int(i) for _, i in zip(range(count), self._pass)]

    def update(self, batch: Any) -> None:
        """A curriculum sampler's ``update(batch)``, after each training step."""
        update = getattr(self.user_sampler, "update", None)
        if callable(update):
            update(batch=batch)

    def state_dict(self) -> dict[str, Any]:
        saver = getattr(self.user_sampler, "state_dict", None)
        return {
            **super().state_dict(),
            "sampler": saver() if callable(saver) and self._resumable() else None,
            "sampler_class": type(self.user_sampler).__name__,
        }

    def _resumable(self) -> bool:
        return callable(getattr(self.user_sampler, "load_state_dict", None))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("sampler") is None:
            name = state.get("sampler_class", type(self.user_sampler).__name__)
            raise DataError(
                f"cannot resume exactly: the sampler {name} ({KEY}.class_name) has no "
                "state_dict()/load_state_dict(), so the prompts it would draw next are unknown; "
                "give it those methods (torchdata's stateful-sampler convention) or start a new run"
            )
        super().load_state_dict(state)
        self.user_sampler.load_state_dict(state["sampler"])
        self._pass = None  # iter() continues the pass the state was taken in


def after_step(loader: Any, batch: Any) -> None:
    """Tell a curriculum sampler the finished step's batch (verl calls ``update`` there)."""
    if isinstance(loader, SamplerLoader):
        loader.update(batch)
