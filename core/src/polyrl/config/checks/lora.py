"""LoRA (``actor_rollout_ref.model.lora_rank > 0``): its keys are in range, the training engine's
spec declares ``supports_lora``, and the reference shares the actor's pool (it is the actor's
model with the adapters off, see :mod:`polyrl.lora`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polyrl.config.checks.checker import Checker
from polyrl.config.checks.placement import pool_of
from polyrl.lora import MODEL, declared_rank, lora_problems
from polyrl.registry import Registration
from polyrl.specs import PluginKind

if TYPE_CHECKING:
    from polyrl.step.pipeline import StepPipeline


def check_lora(
    checker: Checker, selected: dict[str, Registration], pipeline: StepPipeline | None
) -> None:
    model = checker.cfg.actor_rollout_ref.model
    problems = lora_problems(model)
    for problem in problems:
        checker.add(problem)
    rank = declared_rank(model)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        return
    engine = selected.get(PluginKind.TRAINING_ENGINE.config_key)
    if engine is not None and not engine.spec.supports_lora:
        engines = checker.registry.all(PluginKind.TRAINING_ENGINE)
        able = [r.name for r in engines if r.spec.supports_lora]
        checker.add(
            f"{MODEL}.lora_rank={rank}: actor_rollout_ref.actor.strategy="
            f"{engine.name!r} (package {engine.provenance.distribution}) does not support LoRA; "
            f"use one that does ({', '.join(able) or 'none installed'}) or set {MODEL}.lora_rank=0"
        )
    roles = pipeline.roles() if pipeline is not None else ()
    actor_pool, ref_pool = pool_of(checker.cfg, "actor"), pool_of(checker.cfg, "ref")
    if "ref" in roles and ref_pool != actor_pool:
        checker.add(
            f"{MODEL}.lora_rank={rank}: the reference is the actor's model with its "
            f"adapters disabled, so it must run in the actor's pool {actor_pool!r}, not "
            f"{ref_pool!r}: remove trainer.role_pools.ref"
        )
