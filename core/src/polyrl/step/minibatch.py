"""How the actor's update cuts the batch it actually has into mini-batches.

The driver plans; every data-parallel rank executes the same plan on its shard. Planning from the
batch (not from ``data.train_batch_size``) lets a batch that shrank after filtering (DAPO's
dynamic sampling) train in mini-batches as close as possible to the configured size, and makes
"on-policy" a fact about this batch: exactly one optimizer step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from polyrl.errors import PolyrlError
from polyrl.seeding import derive_seed


class MiniBatchError(PolyrlError):
    """The batch cannot be split the way the update needs."""


@dataclass(frozen=True)
class MiniBatchPlan:
    """``epochs[e][m]``: the local row indices (into each rank's shard) of mini-batch ``m`` of
    epoch ``e``. Every rank gets shards of the same size, so one plan serves all ranks and every
    rank takes the same number of optimizer steps (collectives stay in lock-step)."""

    epochs: tuple[tuple[np.ndarray, ...], ...]

    @property
    def optimizer_steps(self) -> int:
        return sum(len(minis) for minis in self.epochs)

    @property
    def on_policy(self) -> bool:
        """One optimizer step: the policy being updated is the one that sampled, so the "old"
        log-probs equal the current ones (detached) and need no separate forward pass."""
        return self.optimizer_steps == 1


def minibatch_sizes(local_rows: int, target_rows: int) -> list[int]:
    """``local_rows`` cut into the fewest parts of at most ``target_rows`` rows, as equal as
    possible (a 24-row shard with a target of 16 gives 12 + 12, not 16 + 8)."""
    if local_rows < 1:
        raise MiniBatchError("the update got an empty batch: nothing to train on this step")
    parts = math.ceil(local_rows / max(1, target_rows))
    base, extra = divmod(local_rows, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def plan_minibatches(
    num_rows: int,
    dp_size: int,
    rows_per_minibatch: int,
    *,
    epochs: int,
    shuffle: bool,
    seed: int,
    step: int,
) -> MiniBatchPlan:
    """The update's plan for a batch of ``num_rows`` rows over ``dp_size`` data-parallel ranks.

    ``rows_per_minibatch`` is the configured global mini-batch (``ppo_mini_batch_size`` prompts x
    ``rollout.n``). With ``shuffle``, each epoch has its own permutation derived from
    ``(seed, step, epoch)``: different at every step and epoch, identical after a resume.
    """
    if num_rows % dp_size:
        raise MiniBatchError(
            f"a batch of {num_rows} rows cannot be split evenly over {dp_size} data-parallel "
            f"ranks (every rank must take the same optimizer steps); a stage that filters rows "
            f"must keep a multiple of {dp_size}"
        )
    local = num_rows // dp_size
    sizes = minibatch_sizes(local, max(1, rows_per_minibatch // dp_size))
    bounds = np.cumsum([0, *sizes])
    planned = []
    for epoch in range(epochs):
        if shuffle:
            rng = np.random.default_rng(derive_seed(seed, "minibatch", step, epoch))
            order = rng.permutation(local)
        else:
            order = np.arange(local)
        planned.append(tuple(order[bounds[i] : bounds[i + 1]] for i in range(len(sizes))))
    return MiniBatchPlan(tuple(planned))
