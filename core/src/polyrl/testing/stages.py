"""A harness that runs one stage on one batch, without Ray, workers or models.

A stage's tests need three things the trainer normally provides: the run plan the stage is bound
to (which estimator, loss, rollout engine were selected), the worker roles it calls, and a
check that it kept its declared contract. :func:`run_stage` gives all three::

    from polyrl.testing.stages import ScriptedRoles, run_stage

    roles = ScriptedRoles({"actor.compute_log_prob": lambda batch: Batch({"log_probs": ...})})
    state = run_stage(MyStage(cfg), batch, cfg=cfg, roles=roles)
    assert state.batch["my_key"] ...
    assert roles.calls[0].method == "compute_log_prob"

Workers answer with the functions given per ``"role.method"``; each call is recorded with its
arguments. The stage's declared ``requires`` must be in the batch before it runs, and its
``provides`` in the batch after it (unless it emptied the batch), as the chain check assumes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from polyrl.batch import Batch
from polyrl.step.context import StepContext
from polyrl.step.pipeline import Stage, StepState
from polyrl.workers.dispatch import Dispatch


@dataclass(frozen=True)
class RoleCall:
    """One call a stage made through ``ctx.workers``."""

    role: str
    method: str
    args: tuple[Any, ...]
    dispatch: Dispatch


class ScriptedRoles:
    """The :class:`polyrl.step.context.RoleCalls` a stage test scripts: ``handlers`` maps
    ``"role.method"`` to the function that answers the call (it gets the call's arguments and
    returns what the gathered result of all ranks would be); ``dp_sizes`` gives each role's
    data-parallel size (1 when absent). A call nobody scripted fails naming it."""

    def __init__(
        self,
        handlers: Mapping[str, Callable[..., Any]] | None = None,
        dp_sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.handlers = dict(handlers or {})
        self.dp_sizes = dict(dp_sizes or {})
        self.calls: list[RoleCall] = []

    def call(self, role: str, method: str, *args: Any, dispatch: Dispatch = Dispatch.DP_SPLIT):
        self.calls.append(RoleCall(role, method, args, dispatch))
        handler = self.handlers.get(f"{role}.{method}")
        if handler is None:
            raise AssertionError(
                f"the stage called {role}.{method}, which this test did not script "
                f"(scripted: {sorted(self.handlers)})"
            )
        return handler(*args)

    def dp_size(self, role: str) -> int:
        return int(self.dp_sizes.get(role, 1))

    def sync_weights(self, source: str, target: str) -> dict[str, float]:
        self.calls.append(RoleCall(source, f"sync_weights->{target}", (), Dispatch.BROADCAST))
        return {"bytes": 0.0, "seconds": 0.0}


def run_stage(
    stage: Stage,
    batch: Batch,
    *,
    cfg: Any = None,
    roles: ScriptedRoles | None = None,
    step: int = 1,
    tokenizer: Any = None,
    reward: Any = None,
    next_prompts: Callable[..., Batch] | None = None,
) -> StepState:
    """Run ``stage`` once on ``batch`` (step ``step``) and return the step's state.

    ``cfg`` (a composed config, or a list of overrides for :func:`polyrl.config.load_config`)
    is what ``ctx.cfg`` holds; the stage is bound to its run plan first
    (:meth:`polyrl.step.Stage.bind`), so the plugins it depends on are the ones ``cfg`` selects
    in the process registry (add your own with the ``register_plugin`` fixture or
    :func:`polyrl.register`). Raises ``AssertionError`` when a declared key is missing before
    or after the stage."""
    if isinstance(cfg, (list, tuple)):
        from polyrl.config import load_config

        cfg = load_config(list(cfg))
    if cfg is not None:
        from polyrl.plan import assemble

        stage.bind(assemble(cfg, check=False))
    missing = [key for key in stage.requires if key not in batch]
    if missing:
        raise AssertionError(
            f"stage {stage.name!r} requires {missing}, which the test batch lacks "
            f"(it has {sorted(batch.tensors) + sorted(batch.non_tensors)})"
        )

    def no_more_prompts(count: int | None = None) -> Batch:
        raise AssertionError(f"stage {stage.name!r} drew more prompts; pass next_prompts=...")

    ctx = StepContext(
        cfg=cfg,
        workers=roles or ScriptedRoles(),
        tokenizer=tokenizer,
        reward=reward,
        next_prompts=next_prompts or no_more_prompts,
    )
    state = StepState(step=step, batch=batch)
    with state.timed(stage.name):
        stage.run(state, ctx)
    if len(state.batch):
        unprovided = [key for key in stage.provides if key not in state.batch]
        if unprovided:
            raise AssertionError(
                f"stage {stage.name!r} declares it provides {unprovided} but did not write them: "
                f"a later stage requiring them would pass `polyrl validate` and fail at run time"
            )
    return state
