"""Batches of prompts, epoch after epoch, resumable to the exact batch.

The order of an epoch is a pure function of ``(seed, epoch)``, so a run resumed from
``state_dict()`` sees exactly the batches the uninterrupted run would have seen, without saving
the permutation itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polyrl.errors import DataError


class PromptLoader:
    """Draws batches of ``batch_size`` prompts from ``dataset`` (anything with ``__len__``,
    ``__getitem__`` and ``pad_token_id``, e.g. :class:`polyrl.data.dataset.RLDataset`).

    ``len(loader)`` is the number of batches per epoch. With ``drop_last`` the incomplete tail of
    an epoch is skipped (every step then has the configured batch size, which the batch
    arithmetic of the workers relies on).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 1,
        drop_last: bool = True,
    ) -> None:
        size = len(dataset)
        if batch_size < 1:
            raise DataError(f"data.train_batch_size={batch_size} must be at least 1")
        if batch_size > size:
            raise DataError(
                f"data.train_batch_size={batch_size} is larger than the dataset "
                f"({size} prompts after filtering); use a batch size of at most {size} or more "
                "data"
            )
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.position = 0  # prompts of the current epoch already handed out
        self._order_epoch = -1
        self._order: np.ndarray = np.arange(size)

    def __len__(self) -> int:
        size = len(self.dataset)
        return size // self.batch_size if self.drop_last else -(-size // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The dataset positions of ``epoch`` in the order they are served."""
        if epoch != self._order_epoch:
            size = len(self.dataset)
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch])
                self._order = rng.permutation(size)
            else:
                self._order = np.arange(size)
            self._order_epoch = epoch
        return self._order

    def next_indices(self, count: int | None = None) -> list[int]:
        """Dataset positions of the next ``count`` prompts (default: ``batch_size``), advancing
        the loader. Dynamic sampling draws batches of another size (``data.gen_batch_size``)
        from the same stream, so a resumed run still sees the same prompts."""
        size = len(self.dataset)
        count = self.batch_size if count is None else int(count)
        if not 1 <= count <= size:
            raise DataError(
                f"cannot draw {count} prompts from a dataset of {size}: ask for 1 to {size} "
                "(data.gen_batch_size and data.train_batch_size must fit the dataset)"
            )
        remaining = size - self.position
        if remaining <= 0 or (self.drop_last and remaining < count):
            self.epoch += 1
            self.position = 0
        order = self.order(self.epoch)
        chosen = order[self.position : self.position + count]
        self.position += len(chosen)
        return [int(i) for i in chosen]

    def next_batch(self, count: int | None = None) -> Any:
        """The next ``count`` prompts (default: ``batch_size``) as a :class:`polyrl.batch.Batch`
        (see ``polyrl.data.dataset.collate``)."""
        from polyrl.data.dataset import collate

        items = [self.dataset[i] for i in self.next_indices(count)]
        return collate(items, self.dataset.pad_token_id)

    # ---- resume ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "dataset_size": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off. The dataset must be the one it was saved with."""
        saved_size = state.get("dataset_size", len(self.dataset))
        if saved_size != len(self.dataset):
            raise DataError(
                f"cannot resume the data loader: the checkpoint was saved with {saved_size} "
                f"prompts, the dataset now has {len(self.dataset)}; resume with the same data "
                "files and data.* settings, or start a new run"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self._order_epoch = -1
