"""One-step off-policy scheduling with fake roles: what each step trains on, which weights
sampled it, that generation overlaps training, and that a checkpoint resumes exactly."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from polyrl.api import (
    Batch,
    ConfigError,
    Stage,
    StepContext,
    StepPipeline,
    StepState,
    SynchronousSchedule,
    SyncWeightsStage,
    load_step_state,
    save_step_state,
)
from polyrl_schedule_offpolicy.one_step_off import (
    OneStepOffSchedule,
    StalenessError,
    split_step,
    staleness_metrics,
)

WAIT_S = 10.0


@dataclass
class FakeRoles:
    """An actor whose weights are a version number, and a rollout that holds a copy."""

    actor: int = 0
    rollout: int = 0
    events: list[tuple[Any, ...]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def log(self, *event: Any) -> None:
        with self.lock:
            self.events.append(event)

    def sync_weights(self, source: str, target: str) -> dict[str, float]:
        self.rollout = self.actor
        self.log("sync", self.actor)
        return {"bytes": 1024.0, "seconds": 0.0}

    def dp_size(self, role: str) -> int:
        return 1


class Gen(Stage):
    """Tags every row with the rollout's weights; waits for ``gate`` when one is set."""

    name, roles = "gen", ("rollout",)

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate

    def run(self, state: StepState, ctx: StepContext) -> None:
        if self.gate is not None and state.step > 1:
            assert self.gate.wait(WAIT_S), "generation never overlapped a training stage"
        roles = ctx.workers
        state.batch["sampled_by"] = torch.full((len(state.batch),), roles.rollout)
        roles.log("gen", state.step, roles.rollout, threading.current_thread().name)


class Score(Stage):
    """A scoring stage without roles: runs with generation; its state counts scored steps."""

    name = "reward"

    def __init__(self) -> None:
        self.scored: list[int] = []

    def run(self, state: StepState, ctx: StepContext) -> None:
        self.scored.append(state.step)
        state.metrics["reward/mean"] = float(state.batch["index"].float().mean())

    def state_dict(self) -> dict[str, Any]:
        return {"scored": list(self.scored)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scored = list(state["scored"])


class Train(Stage):
    """One update: the actor's version goes up by one; opens ``gate`` while it trains."""

    name, roles = "update_actor", ("actor",)

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate

    def run(self, state: StepState, ctx: StepContext) -> None:
        roles = ctx.workers
        if self.gate is not None:
            self.gate.set()
        batch = state.batch
        roles.log("train", state.step, batch["index"].tolist(), batch["sampled_by"].tolist())
        roles.actor += 1
        if self.gate is not None:
            self.gate.clear()


class Prompts:
    """Batches of 2 consecutive indices, resumable like the real loader."""

    def __init__(self) -> None:
        self.position = 0

    def __call__(self, count: int | None = None) -> Batch:
        rows = list(range(self.position, self.position + (count or 2)))
        self.position += len(rows)
        return Batch({"index": torch.tensor(rows)}, {"uid": np.array([str(r) for r in rows])})


def pipeline(gate: threading.Event | None = None) -> StepPipeline:
    return StepPipeline([Gen(gate), Score(), Train(gate), SyncWeightsStage()], initial_keys=())


def context(roles: FakeRoles, prompts: Prompts) -> StepContext:
    return StepContext(cfg=None, workers=roles, tokenizer=None, reward=None, next_prompts=prompts)


def run_steps(schedule: Any, ctx: StepContext, steps: range, last: int) -> list[StepState]:
    return [schedule.run(s, ctx, prefetch_next=s < last) for s in steps]


def trained(roles: FakeRoles) -> list[tuple[Any, ...]]:
    return [e[1:] for e in roles.events if e[0] == "train"]


def test_each_step_trains_on_samples_of_the_previous_policy() -> None:
    roles, prompts = FakeRoles(), Prompts()
    schedule = OneStepOffSchedule(None, pipeline())
    states = run_steps(schedule, context(roles, prompts), range(1, 5), last=4)
    # step k trains version k-1 on samples of version k-2 (the first step: its own).
    assert trained(roles) == [
        (1, [0, 1], [0, 0]),
        (2, [2, 3], [0, 0]),
        (3, [4, 5], [1, 1]),
        (4, [6, 7], [2, 2]),
    ]
    assert [s.batch["policy_version"].tolist() for s in states] == [[0, 0], [0, 0], [1, 1], [2, 2]]
    assert [s.metrics["async/staleness/max"] for s in states] == [0.0, 1.0, 1.0, 1.0]
    assert [s.metrics["async/policy_version"] for s in states] == [0.0, 1.0, 2.0, 3.0]
    assert all("gen_wait" in s.timing for s in states[1:])
    # The sync moved from the end of the step to before the next generation is launched.
    order = [e[:2] for e in roles.events if e[0] in ("sync", "gen")]
    assert order == [("gen", 1), ("gen", 2), ("sync", 1), ("gen", 3), ("sync", 2), ("gen", 4)]
    assert prompts.position == 8  # no prefetch past the last step


def test_the_synchronous_schedule_trains_on_policy() -> None:
    roles = FakeRoles()
    run_steps(SynchronousSchedule(None, pipeline()), context(roles, Prompts()), range(1, 4), last=3)
    assert trained(roles) == [(1, [0, 1], [0, 0]), (2, [2, 3], [1, 1]), (3, [4, 5], [2, 2])]


def test_generation_of_the_next_step_runs_while_this_step_trains() -> None:
    # Generation of step k+1 waits until the update of step k is under way: run one after the
    # other this would time out.
    gate, roles = threading.Event(), FakeRoles()
    schedule = OneStepOffSchedule(None, pipeline(gate))
    run_steps(schedule, context(roles, Prompts()), range(1, 4), last=3)
    threads = {e[1]: e[3] for e in roles.events if e[0] == "gen"}
    assert threads[1] == threading.current_thread().name
    assert threads[2] != threads[1] and threads[3] != threads[1]


def test_validation_sees_the_actor_just_trained() -> None:
    roles = FakeRoles()
    schedule = OneStepOffSchedule(None, pipeline())
    ctx = context(roles, Prompts())
    run_steps(schedule, ctx, range(1, 3), last=4)
    assert roles.rollout == 1 and roles.actor == 2
    schedule.before_validation(ctx)
    assert roles.rollout == 2
    schedule.run(3, ctx, prefetch_next=True)  # sampled before the validation, by version 1
    assert trained(roles)[-1] == (3, [4, 5], [1, 1])


def test_a_checkpoint_holds_the_batch_generated_ahead(tmp_path: Path) -> None:
    straight_roles = FakeRoles()
    straight = OneStepOffSchedule(None, pipeline())
    run_steps(straight, context(straight_roles, Prompts()), range(1, 5), last=4)

    # Steps 1-2 of a run that checkpoints after step 2: the trainer has it prefetch step 3.
    roles, prompts = FakeRoles(), Prompts()
    first = OneStepOffSchedule(None, pipeline())
    ctx = context(roles, prompts)
    first.run(1, ctx, prefetch_next=True)
    first.run(2, ctx, prefetch_next=True)
    driver_state = {"step": 2, **first.save(str(tmp_path))}
    assert driver_state["off_policy"] == {"actor_version": 2, "ahead": [3]}

    # A fresh process: the actor restored at version 2, the rollout at whatever it loaded.
    resumed_roles = FakeRoles(actor=2, rollout=0)
    resumed = OneStepOffSchedule(None, pipeline())
    resumed.load(str(tmp_path), driver_state)
    resumed_prompts = Prompts()
    resumed_prompts.position = prompts.position
    run_steps(resumed, context(resumed_roles, resumed_prompts), range(3, 5), last=4)
    assert trained(resumed_roles) == trained(straight_roles)[2:]


def test_a_generation_failure_surfaces_in_the_next_step() -> None:
    class Failing(Gen):
        def run(self, state: StepState, ctx: StepContext) -> None:
            if state.step == 2:
                raise RuntimeError("rollout worker 0 died")
            super().run(state, ctx)

    schedule = OneStepOffSchedule(
        None, StepPipeline([Failing(), Train(), SyncWeightsStage()], initial_keys=())
    )
    ctx = context(FakeRoles(), Prompts())
    schedule.run(1, ctx, prefetch_next=True)
    with pytest.raises(RuntimeError, match="rollout worker 0 died"):
        schedule.run(2, ctx, prefetch_next=True)


def test_staleness_beyond_one_version_is_an_error() -> None:
    batch = Batch({"policy_version": torch.tensor([3, 3])})
    assert staleness_metrics(batch, 4, bound=1)["async/staleness/max"] == 1.0
    with pytest.raises(StalenessError, match="version\\(s\\) \\[3\\]"):
        staleness_metrics(batch, 5, bound=1)
    with pytest.raises(StalenessError):
        staleness_metrics(batch, 2, bound=1)


def test_generation_is_the_leading_rollout_only_stages() -> None:
    generation, training, sync = split_step(pipeline())
    assert generation.names() == ["gen", "reward"]
    assert training.names() == ["update_actor"]
    assert sync.name == "update_weights"


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([Train(), SyncWeightsStage()], "does not generate"),
        ([Train(), Gen(), SyncWeightsStage()], r"\['gen'\] call the rollout after"),
        ([Gen(), Train()], "no 'update_weights' stage"),
    ],
)
def test_steps_that_cannot_run_ahead_are_refused(stages: list[Stage], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        split_step(StepPipeline(stages, initial_keys=()))


def test_a_saved_step_loads_without_unpickling_code(tmp_path: Path) -> None:
    batch = Batch(
        {"responses": torch.tensor([[1, 2], [3, 4]])[:, :1]},  # a view: saved as its own data
        {
            "reward_baselines": np.array([np.float64(0.5), np.float64(1.5)], dtype=object),
            "extra_info": [{"index": np.int64(3), "tags": ("a", "b")}, None],
            "uid": np.array(["x", "y"], dtype=object),
        },
    )
    state = StepState(step=7, batch=batch, metrics={"reward/mean": 0.25}, timing={"gen": 1.5})
    save_step_state(str(tmp_path / "state.pt"), state)
    loaded = load_step_state(str(tmp_path / "state.pt"))
    assert loaded.step == 7 and loaded.metrics == state.metrics and loaded.timing == state.timing
    assert torch.equal(loaded.batch["responses"], torch.tensor([[1], [3]]))
    assert list(loaded.batch["reward_baselines"]) == [0.5, 1.5]
    assert list(loaded.batch["extra_info"]) == [{"index": 3, "tags": ("a", "b")}, None]
    assert list(loaded.batch["uid"]) == ["x", "y"]
