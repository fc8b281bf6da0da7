"""Which algorithm a config selects, and its step pipeline.

``algorithm.name`` names an algorithm plugin explicitly; when it is null, the algorithm that
lists ``algorithm.adv_estimator`` among its ``estimators`` is selected (verl's command lines pick
algorithms this way). An estimator that no algorithm claims (an estimator-only plugin) runs the
built-in ``policy_gradient`` step.
"""

from __future__ import annotations

from typing import Any

from polyrl.errors import ConfigError
from polyrl.registry import Registration, Registry, get_registry
from polyrl.specs import PluginKind
from polyrl.step.pipeline import StepPipeline

FALLBACK_ALGORITHM = "policy_gradient"


def select_algorithm(
    name: str | None, adv_estimator: str, registry: Registry | None = None
) -> Registration:
    """The algorithm registration for ``algorithm.name`` / ``algorithm.adv_estimator``."""
    registry = registry or get_registry()
    if name:
        return registry.get(PluginKind.ALGORITHM, name)
    owners = [r for r in registry.all(PluginKind.ALGORITHM) if adv_estimator in r.spec.estimators]
    if len(owners) > 1:
        listed = ", ".join(f"{r.name} ({r.provenance.distribution})" for r in owners)
        raise ConfigError(
            f"algorithm.adv_estimator={adv_estimator!r} is claimed by several algorithms: "
            f"{listed}; choose one with algorithm.name=<name>"
        )
    if owners:
        return owners[0]
    return registry.get(PluginKind.ALGORITHM, FALLBACK_ALGORITHM)


def build_pipeline(cfg: Any, registry: Registry | None = None) -> StepPipeline:
    """The step of the algorithm ``cfg`` selects, checked against the roles it declares."""
    registration = select_algorithm(cfg.algorithm.name, str(cfg.algorithm.adv_estimator), registry)
    pipeline = registration.load()(cfg)
    if not isinstance(pipeline, StepPipeline):
        raise ConfigError(
            f"algorithm {registration.name!r} (package {registration.provenance.distribution}) "
            f"returned {type(pipeline).__name__} from its pipeline function, not a StepPipeline"
        )
    undeclared = [r for r in pipeline.roles() if r not in registration.spec.roles]
    if undeclared:
        raise ConfigError(
            f"algorithm {registration.name!r} (package {registration.provenance.distribution}) "
            f"has stages that use the role(s) {undeclared}, which its AlgorithmSpec.roles "
            f"{list(registration.spec.roles)} does not declare; report it upstream"
        )
    return pipeline
