"""What stages run with: the config, the worker roles, the tokenizer and the reward provider."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from polyrl.batch import Batch
    from polyrl.interfaces import RewardProvider, SamplingParams
    from polyrl.workers.dispatch import Dispatch


class RoleCalls(Protocol):
    """The driver's handle on the worker roles (built by :mod:`polyrl.workers`).

    ``call("ref", "compute_log_prob", batch, dispatch=Dispatch.DP_SPLIT)`` runs the method of
    the ``ref`` role on every worker hosting it, each data-parallel rank getting its rows;
    tensor- or pipeline-parallel peers of one data-parallel rank get the same rows, and one
    output per data-parallel rank comes back. ``dp_size(role)`` is that role's number of
    data-parallel ranks. ``sync_weights(source, target)`` streams the full weights of one role
    (``actor``) into another (``rollout``) and returns ``{"bytes": ..., "seconds": ...}``.
    """

    def call(self, role: str, method: str, *args: Any, dispatch: Dispatch = ...) -> Any: ...

    def dp_size(self, role: str) -> int: ...

    def sync_weights(self, source: str, target: str) -> dict[str, float]: ...


@dataclass
class StepContext:
    """Handed to every :meth:`polyrl.step.Stage.run`. ``cfg`` is the composed, validated run
    config (read-only: stages never change it). ``next_prompts(count=None)`` draws the next
    ``count`` prompts (default ``data.train_batch_size``) from the training data, beyond the
    batch each step starts with (a stage that filters groups and samples again, as DAPO's
    dynamic sampling does with ``data.gen_batch_size`` prompts per round); the draws are part of
    the loader's state, so a resumed run draws the same prompts. ``episodes(prompts, params)``
    is the multi-turn ``gen`` stage's episode runner when the run has one
    (``multi_turn.enable``; ``(trajectory batch, multi_turn/* metrics)``), so that validation
    plays the run's environment; None otherwise."""

    cfg: Any
    workers: RoleCalls
    tokenizer: Any
    reward: RewardProvider
    next_prompts: Callable[..., Batch]
    episodes: Callable[[Batch, SamplingParams], tuple[Batch, dict[str, float]]] | None = None
