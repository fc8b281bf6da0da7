"""The training step as a pipeline of stages with a declared data contract.

A step is a list of :class:`Stage` objects run in order on one :class:`StepState`. Each stage
declares the batch keys it ``requires`` and ``provides`` and the worker ``roles`` it calls, so
that :meth:`StepPipeline.check` can prove, before any device is taken, that every key a stage
reads is produced by the data loader or an earlier stage, and the trainer can build only the
roles the step uses. Algorithms own their pipeline (see :class:`polyrl.specs.AlgorithmSpec`):
they start from the standard policy-gradient step and edit it with :meth:`StepPipeline.insert_after`
and friends, or assemble their own list.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polyrl.batch import Batch
    from polyrl.plan import RunPlan
    from polyrl.step.context import StepContext

# What the data loader puts in every step's batch (see polyrl.data.dataset.collate).
PROMPT_BATCH_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "data_source",
    "ground_truth",
    "extra_info",
    "raw_prompt",
    "index",
    "messages",
)


@dataclass
class StepState:
    """What flows through one step: the growing batch, and the metrics and timings so far."""

    step: int
    batch: Batch
    metrics: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)

    def record_sampled_scores(self, *sampled: Batch) -> None:
        """For a stage that drops rows (a group filter): call it with the scored batch(es) before
        filtering (``token_level_scores`` of every sampled response). The step's
        ``critic/score/*`` then describe those sampled responses, and the trainer reports the
        rows that reach the end of the step (the ones trained on) as ``critic/kept_score/*``.
        Without a call, ``critic/score/*`` describe the step's final batch, which is then the
        sampled one. (The filter records them, not the reward stage: scoring stages after the
        reward's, such as DAPO's overlong penalty, still change the scores.)"""
        from polyrl.trainer.metrics import sampled_score_metrics

        self.metrics.update(sampled_score_metrics(sampled))

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``timing_s/<name>``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timing[name] = self.timing.get(name, 0.0) + time.perf_counter() - start


class Stage:
    """One part of a step. Subclasses set the four declarations and implement :meth:`run`.

    ``name`` is unique in a pipeline and is also the timing key (``timing_s/<name>``).
    ``requires``: batch keys read; ``provides``: batch keys written (a key may be both: a stage
    that reshapes rewards requires and provides ``token_level_rewards``). ``roles``: worker
    roles called through ``ctx.workers`` (``actor``, ``rollout``, ``ref`` ...). A stage may keep
    state across steps (a KL controller): :meth:`state_dict` is saved in every checkpoint and
    handed back to :meth:`load_state_dict` on resume.

    ``recomputes_on_policy``: keys of ``requires`` the stage computes itself when the batch
    lacks them and the update is a single optimizer step (the actor update takes the detached
    log-probs of its own forward pass as ``old_log_probs``). A stage providing such a key may
    skip its work when no other stage reads it (see :meth:`link`); every other reader gets it.
    """

    name: str = ""
    requires: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    recomputes_on_policy: tuple[str, ...] = ()

    def bind(self, plan: RunPlan) -> None:
        """Called once with the run plan (:func:`polyrl.plan.assemble`), before the key chain is
        checked: a stage whose declarations or work depend on the selected plugins (the
        estimator's ``requires``, the rollout engine's log-probs) takes them from ``plan`` here,
        so that no stage looks plugins up itself."""

    def link(self, later: Sequence[Stage]) -> None:
        """Called by the pipeline before every run with the stages that run after this one: a
        stage whose work depends on who reads what it provides decides here (the old log-probs
        stage skips its forward pass on an on-policy step only when no later stage but an
        update that recomputes them reads ``old_log_probs``)."""

    def run(self, state: StepState, ctx: StepContext) -> None:
        raise NotImplementedError(f"stage {self.name!r} ({type(self).__name__}) must define run()")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (stateless stages ignore it)."""

    def finish(self) -> None:
        """Called once after a run's last step: a stage that judges the run over several steps
        (the reward stage's failure window, which a short run never fills) raises a
        :class:`polyrl.errors.PolyrlError` here when the run must not count as finished."""

    def __repr__(self) -> str:
        return f"<stage {self.name}: {list(self.requires)} -> {list(self.provides)}>"


class StepPipeline:
    """An ordered list of uniquely named stages with editing operations.

    ``initial_keys`` are the batch keys each step starts with: the data loader's prompt batch by
    default; an algorithm that brings its own data (``AlgorithmSpec.data``: preference pairs for
    offline DPO) names the keys of its batches, and the chain check starts from them.
    """

    def __init__(
        self, stages: Iterable[Stage], *, initial_keys: Iterable[str] = PROMPT_BATCH_KEYS
    ) -> None:
        self.initial_keys = tuple(initial_keys)
        self.extra_roles: tuple[str, ...] = ()
        self.stages: list[Stage] = []
        for stage in stages:
            self._add(len(self.stages), stage)

    def names(self) -> list[str]:
        return [stage.name for stage in self.stages]

    def __getitem__(self, name: str) -> Stage:
        return self.stages[self._position(name)]

    def __contains__(self, name: str) -> bool:
        return name in self.names()

    def _position(self, name: str) -> int:
        names = self.names()
        if name not in names:
            raise KeyError(f"no stage {name!r} in the pipeline; stages: {names}")
        return names.index(name)

    def _add(self, position: int, stage: Stage) -> None:
        if not stage.name:
            raise ValueError(f"{type(stage).__name__} has no name: set the class attribute `name`")
        if stage.name in self.names():
            raise ValueError(
                f"the pipeline already has a stage named {stage.name!r}: stage names are unique "
                f"(they key timings and checkpoints); stages: {self.names()}"
            )
        self.stages.insert(position, stage)

    def insert_after(self, name: str, stage: Stage) -> None:
        self._add(self._position(name) + 1, stage)

    def insert_before(self, name: str, stage: Stage) -> None:
        self._add(self._position(name), stage)

    def append(self, stage: Stage) -> None:
        self._add(len(self.stages), stage)

    def replace(self, name: str, stage: Stage) -> None:
        position = self._position(name)
        del self.stages[position]
        self._add(position, stage)

    def remove(self, name: str) -> None:
        del self.stages[self._position(name)]

    # ---- the contract --------------------------------------------------------------------------
    def bind(self, plan: RunPlan) -> None:
        """Hand the run plan to every stage (:meth:`Stage.bind`)."""
        for stage in self.stages:
            stage.bind(plan)

    def add_roles(self, roles: Iterable[str]) -> None:
        """Roles the step reaches through a plugin its stages call rather than by a stage's own
        call (a reward provider's judge): placed and started like the stages' roles."""
        self.extra_roles = tuple(dict.fromkeys((*self.extra_roles, *roles)))

    def roles(self) -> tuple[str, ...]:
        """The worker roles the stages call, in first-use order, then :meth:`add_roles`'."""
        seen: dict[str, None] = {}
        for stage in self.stages:
            seen.update(dict.fromkeys(stage.roles))
        seen.update(dict.fromkeys(self.extra_roles))
        return tuple(seen)

    def check(self, initial_keys: Iterable[str] | None = None) -> list[str]:
        """One line per batch key a stage requires that neither ``initial_keys`` (default: the
        pipeline's own, those of the batches its data loader makes) nor an earlier stage
        provides."""
        available = set(self.initial_keys if initial_keys is None else initial_keys)
        problems = []
        for position, stage in enumerate(self.stages):
            for key in stage.requires:
                if key in available:
                    continue
                later = [s.name for s in self.stages[position + 1 :] if key in s.provides]
                where = (
                    f"only the later stage(s) {', '.join(later)} provide it"
                    if later
                    else "no stage provides it"
                )
                problems.append(
                    f"stage {stage.name!r} requires batch key {key!r}, but {where} "
                    f"(stages in order: {' -> '.join(self.names())}); add or move a stage that "
                    f"provides {key!r} before {stage.name!r}"
                )
            available.update(stage.provides)
        return problems

    def describe(self) -> str:
        """One line per stage: name, roles, keys required and provided (``polyrl validate``)."""
        lines = []
        for stage in self.stages:
            roles = f" [{', '.join(stage.roles)}]" if stage.roles else ""
            lines.append(
                f"  {stage.name}{roles}: {', '.join(stage.requires) or '-'} -> "
                f"{', '.join(stage.provides) or '-'}"
            )
        return "\n".join(lines)

    def link(self) -> None:
        """Show every stage the stages after it (:meth:`Stage.link`). :meth:`run` does it first,
        so a pipeline edited after it was checked still runs as it reads."""
        for position, stage in enumerate(self.stages):
            stage.link(self.stages[position + 1 :])

    def finish(self) -> None:
        """Every stage's :meth:`Stage.finish`, after the run's last step."""
        for stage in self.stages:
            stage.finish()

    def run(self, state: StepState, ctx: StepContext) -> StepState:
        self.link()
        for stage in self.stages:
            with state.timed(stage.name):
                stage.run(state, ctx)
        return state

    def state_dict(self) -> dict[str, dict[str, Any]]:
        return {stage.name: stage.state_dict() for stage in self.stages if stage.state_dict()}

    def load_state_dict(self, states: dict[str, dict[str, Any]]) -> None:
        for stage in self.stages:
            if stage.name in states:
                stage.load_state_dict(states[stage.name])
