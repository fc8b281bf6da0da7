"""Check a resolved config before any device is taken or any model is loaded.

``polyrl validate`` and the trainer call :func:`validate_config`; it returns every problem it finds
(one line each: what is wrong and how to fix it) instead of stopping at the first, so a user can
fix a command line in one go. The checks live in :mod:`polyrl.config.checks`, one module per
concern; plugin-specific rules come from the selected plugins' own ``config_check``. Plugin
implementations named by import string are only *located*, so a missing backend is reported here
rather than after a GPU job has started; the selected algorithm's step is built (it loads no
model) to check its data chain.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from polyrl.config.checks import (
    batches,
    contracts,
    data,
    lora,
    model,
    off_policy,
    placement,
    plugins,
    ranges,
)
from polyrl.config.checks import pipeline as step
from polyrl.config.checks.checker import MISSING, Checker, as_list, get
from polyrl.errors import PolyrlError
from polyrl.lora import describe_lora
from polyrl.registry import Registry, get_registry
from polyrl.specs import PluginKind


def validate_config(cfg: DictConfig, registry: Registry | None = None) -> list[str]:
    """Every problem of ``cfg``, one human-readable line each; an empty list means valid."""
    checker = Checker(cfg, registry or get_registry())
    problems, notices = verl_lines(cfg)
    checker.problems.extend(problems)
    for line in notices:
        checker.notice(line)
    selected = plugins.check_selection(checker)
    algorithm = step.select_algorithm(checker)
    if algorithm is not None:
        selected[step.ALGORITHM_KEY] = algorithm
    plugins.check_capabilities(checker, selected)
    plugins.check_sections(checker, selected)
    model.check_model(checker)
    data.check_data(checker)
    ranges.check_ranges(checker)
    batches.check_batches(checker)
    pipeline = step.check_step(checker, selected, algorithm)
    placement.check_placement(checker, pipeline)
    off_policy.check_off_policy(checker, pipeline)
    lora.check_lora(checker, selected, pipeline)
    plugins.run_plugin_checks(checker, selected)
    contracts.check_contracts(checker, selected)
    return checker.problems


def verl_lines(cfg: DictConfig) -> tuple[list[str], list[str]]:
    """``(problems, notices)`` for verl's keys that polyrl refuses or that have no effect here
    (:mod:`polyrl.config.verl_compat`)."""
    from polyrl.config.keys import schema_keys
    from polyrl.config.sections import schema_defaults
    from polyrl.config.verl_compat import check

    return check(cfg, schema_defaults(), set(schema_keys()))


def summarize(cfg: DictConfig, registry: Registry | None = None) -> str:
    """A few lines that say what a run with the valid config ``cfg`` would do: the algorithm and
    its step, the placement of its roles, the engines, LoRA, the data and the batch
    arithmetic."""
    registry = registry or get_registry()

    def g(key: str) -> Any:
        value = get(cfg, key)
        return "???" if value is MISSING else value

    train, n = g("data.train_batch_size"), g("actor_rollout_ref.rollout.n")
    nnodes, per_node = g("trainer.nnodes"), g("trainer.n_gpus_per_node")
    mini = g("actor_rollout_ref.actor.ppo_mini_batch_size")
    lines = [_algorithm_line(cfg, registry, g), *_step_lines(cfg, registry)]
    lines += [
        f"model: {g('actor_rollout_ref.model.path')}",
        f"engines: train {g('actor_rollout_ref.actor.strategy')}, "
        f"rollout {g('actor_rollout_ref.rollout.name')}, "
        f"reward {g('reward_model.reward_manager')}, "
        f"loggers {', '.join(map(str, as_list(g('trainer.logger'))))}",
        f"data: train {g('data.train_files')}, val {g('data.val_files')}",
    ]
    lines += [line for line in [describe_lora(cfg, registry)] if line]
    if all(isinstance(v, int) and v > 0 for v in (train, n, nnodes, per_node, mini)):
        world = nnodes * per_node
        lines.append(
            f"batch: {train} prompts x n={n} = {train * n} responses per step on {world} "
            f"device(s) ({g('trainer.device')}); {max(train // mini, 1)} mini-batch(es) of "
            f"{mini * n} responses, {g('actor_rollout_ref.actor.ppo_epochs')} epoch(s)"
        )
    steps = g("trainer.total_training_steps")
    lines.append(
        f"length: {g('trainer.total_epochs')} epoch(s)"
        + (f", stop after {steps} steps" if isinstance(steps, int) else "")
    )
    return "\n".join(lines)


def _algorithm_line(cfg: DictConfig, registry: Registry, g: Any) -> str:
    details = (
        f"estimator {g('algorithm.adv_estimator')}, "
        f"loss {g('actor_rollout_ref.actor.policy_loss.loss_mode')}, "
        f"agg {g('actor_rollout_ref.actor.loss_agg_mode')}"
    )
    try:
        from polyrl.plan import select_algorithm

        name = g("algorithm.name")
        reg = select_algorithm(
            name if isinstance(name, str) else None, str(g("algorithm.adv_estimator")), registry
        )
    except (ImportError, PolyrlError) as exc:
        return f"algorithm: ? ({details}; not selectable: {' '.join(str(exc).split())})"
    return (
        f"algorithm: {reg.name} (package {reg.provenance.distribution} "
        f"{reg.provenance.version}; {details})"
    )


def _step_lines(cfg: DictConfig, registry: Registry) -> list[str]:
    if any(
        not isinstance(get(cfg, kind.config_key), str)
        for kind in (PluginKind.ROLLOUT_ENGINE, PluginKind.ADVANTAGE_ESTIMATOR)
    ):
        return []
    try:
        plan = step.build_plan(cfg, registry)
    except Exception as exc:  # noqa: BLE001 - the summary says so; validate_config reports it
        return [f"step: cannot be built ({type(exc).__name__}: {' '.join(str(exc).split())})"]
    from polyrl.workers.placement import plan_pools

    pipeline = plan.pipeline
    roles = pipeline.roles()
    try:
        plan.pools = dict(plan_pools(cfg, roles))
    except PolyrlError:
        plan.pools = None  # validate_config reports the placement's problem
    return [
        "step:",
        pipeline.describe(),
        f"placement: {placement.describe_placement(cfg, roles)}",
        off_policy.describe_schedule(cfg, pipeline, plan.schedule),
        *plan.describe_plugins(),
        *plan.describe_pools(),
    ]
