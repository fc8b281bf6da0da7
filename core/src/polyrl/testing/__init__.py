"""Test helpers for polyrl plugins: conformance suites and pytest fixtures.

A plugin's tests subclass one conformance class per registration and inherit real tests::

    from polyrl.testing import AdvantageEstimatorConformance

    class TestMyEstimator(AdvantageEstimatorConformance):
        plugin_name = "myestimator"

The fixtures ``polyrl_registry``, ``isolated_registry`` and ``register_plugin`` come from the pytest
plugin :mod:`polyrl.testing.pytest_plugin`, which pytest loads automatically once polyrl is
installed.

This package is imported by that pytest plugin in *every* pytest run, so it stays light: the
conformance classes (which need pytest, and torch inside their tests) are imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AdvantageEstimatorConformance",
    "AlgorithmConformance",
    "LoggerConformance",
    "PolicyLossConformance",
    "RewardProviderConformance",
    "RolloutEngineConformance",
    "TrainingEngineConformance",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from polyrl.testing import conformance

        return getattr(conformance, name)
    raise AttributeError(f"module 'polyrl.testing' has no attribute {name!r}")
