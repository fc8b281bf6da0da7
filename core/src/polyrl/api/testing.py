"""polyrl's public test helpers: what a plugin's tests, and a plugin's own ``testing`` module,
import from core.

::

    from polyrl.api.testing import AdvantageEstimatorConformance, algorithm_config

    class TestMyEstimator(AdvantageEstimatorConformance):
        plugin_name = "myestimator"

- conformance suites, one base test class per plugin kind (:mod:`polyrl.testing`);
- ``actor_config`` / ``algorithm_config``: the schema nodes a policy loss / an estimator receives;
- ``schema_config()``: the run config's whole schema (core's keys and every installed plugin's
  sections) at its defaults, to compose a whole config in a test; ``PolyrlConfig``: core's part;
- ``build_tiny_model``: polyrl's tiny Qwen2 (random weights, its own tokenizer) saved to a folder;
- ``rollout_contract``: the scaffolding of the rollout engines' contract tests (a module);
- ``run_stage`` (with ``ScriptedRoles``, ``RoleCall``): one stage on one batch, without Ray;
- ``worker_plan``: the plugins a role built from a config needs, for tests of a role;
- ``run_polyrl``: the ``polyrl`` command line in a fresh interpreter; ``run_polyrl_here``: in the
  test's own process (no start-up, no re-imports); ``IN_PROCESS_OVERRIDES``: the overrides that
  train in that one process, without Ray (end-to-end tests of a plugin).

The fixtures ``polyrl_registry``, ``isolated_registry`` and ``register_plugin`` need no import:
pytest loads them from :mod:`polyrl.testing.pytest_plugin` once polyrl is installed. Covered by
:data:`polyrl.api.API_VERSION`. Every name is resolved on first access (the conformance suites
import pytest; the tiny model imports torch and transformers when it builds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from polyrl.api._lazy import lazy_attributes as _lazy_attributes

# name -> "module:attribute", or "module" for a module itself (as in polyrl.api).
_LAZY: dict[str, str] = {
    "AdvantageEstimatorConformance": "polyrl.testing.conformance:AdvantageEstimatorConformance",
    "AlgorithmConformance": "polyrl.testing.conformance:AlgorithmConformance",
    "LoggerConformance": "polyrl.testing.conformance:LoggerConformance",
    "PolicyLossConformance": "polyrl.testing.conformance:PolicyLossConformance",
    "RewardProviderConformance": "polyrl.testing.conformance:RewardProviderConformance",
    "RolloutEngineConformance": "polyrl.testing.conformance:RolloutEngineConformance",
    "TrainingEngineConformance": "polyrl.testing.conformance:TrainingEngineConformance",
    "actor_config": "polyrl.testing.configs:actor_config",
    "algorithm_config": "polyrl.testing.configs:algorithm_config",
    "PolyrlConfig": "polyrl.config.schema:PolyrlConfig",
    "schema_config": "polyrl.config.sections:schema_config",
    "build_tiny_model": "polyrl.models.tiny:build_tiny_model",
    "rollout_contract": "polyrl.testing.rollout_contract",
    "RoleCall": "polyrl.testing.stages:RoleCall",
    "ScriptedRoles": "polyrl.testing.stages:ScriptedRoles",
    "run_stage": "polyrl.testing.stages:run_stage",
    "worker_plan": "polyrl.testing.plans:worker_plan",
    "IN_PROCESS_OVERRIDES": "polyrl.testing.cli:IN_PROCESS_OVERRIDES",
    "run_polyrl": "polyrl.testing.cli:run_polyrl",
    "run_polyrl_here": "polyrl.testing.cli:run_polyrl_here",
}

if TYPE_CHECKING:
    from polyrl.config.schema import PolyrlConfig
    from polyrl.config.sections import schema_config
    from polyrl.models.tiny import build_tiny_model
    from polyrl.testing import rollout_contract
    from polyrl.testing.cli import IN_PROCESS_OVERRIDES, run_polyrl, run_polyrl_here
    from polyrl.testing.configs import actor_config, algorithm_config
    from polyrl.testing.conformance import (
        AdvantageEstimatorConformance,
        AlgorithmConformance,
        LoggerConformance,
        PolicyLossConformance,
        RewardProviderConformance,
        RolloutEngineConformance,
        TrainingEngineConformance,
    )
    from polyrl.testing.plans import worker_plan
    from polyrl.testing.stages import RoleCall, ScriptedRoles, run_stage

__all__ = [
    "IN_PROCESS_OVERRIDES",
    "AdvantageEstimatorConformance",
    "AlgorithmConformance",
    "LoggerConformance",
    "PolicyLossConformance",
    "PolyrlConfig",
    "RewardProviderConformance",
    "RoleCall",
    "RolloutEngineConformance",
    "ScriptedRoles",
    "TrainingEngineConformance",
    "actor_config",
    "algorithm_config",
    "build_tiny_model",
    "rollout_contract",
    "run_polyrl",
    "run_polyrl_here",
    "run_stage",
    "schema_config",
    "worker_plan",
]


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, __all__)
