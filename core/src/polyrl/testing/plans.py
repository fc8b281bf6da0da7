"""Run-plan helpers for tests of roles and stages that do not assemble a whole run."""

from __future__ import annotations

from typing import Any

from polyrl.plan import select_plugins
from polyrl.registry import Registry, get_registry
from polyrl.specs import PluginKind
from polyrl.workers.worker_plan import WorkerPlan

# What core's roles build: the actor and reference their training engine, the actor its policy
# loss (and the rollout's spec for LoRA), the rollout its engine.
ROLE_KINDS = (PluginKind.TRAINING_ENGINE, PluginKind.ROLLOUT_ENGINE, PluginKind.POLICY_LOSS)


def worker_plan(
    cfg: Any, registry: Registry | None = None, kinds: tuple[PluginKind, ...] = ROLE_KINDS
) -> WorkerPlan:
    """The :class:`~polyrl.workers.worker_plan.WorkerPlan` a role built from ``cfg`` needs:
    the plugins ``cfg``'s keys of ``kinds`` select in ``registry`` (the process registry by
    default, e.g. one with plugins added by ``register_plugin``), without an algorithm."""
    plugins = select_plugins(cfg, registry or get_registry(), None, kinds)
    return WorkerPlan({(reg.kind, reg.name): reg for reg in plugins.values()})
