"""polyrl's conformance suites, run on every registration of polyrl-algo-reinforce."""

from typing import Any

from polyrl.testing import AdvantageEstimatorConformance, AlgorithmConformance


class TestRemaxConformance(AdvantageEstimatorConformance):
    plugin_name = "remax"

    def extra_fields(self, rows: int, length: int) -> dict[str, Any]:
        import torch

        gen = torch.Generator().manual_seed(rows)
        return {"reward_baselines": torch.randn(rows, generator=gen)}


class TestReinforcePlusPlusConformance(AdvantageEstimatorConformance):
    plugin_name = "reinforce_plus_plus"


class TestReinforcePlusPlusDiscountedConformance(AdvantageEstimatorConformance):
    plugin_name = "reinforce_plus_plus"
    config_overrides = {"gamma": 0.9}


class TestReinforcePlusPlusBaselineConformance(AdvantageEstimatorConformance):
    plugin_name = "reinforce_plus_plus_baseline"


class TestRemaxAlgorithmConformance(AlgorithmConformance):
    plugin_name = "remax"


class TestReinforcePlusPlusAlgorithmConformance(AlgorithmConformance):
    plugin_name = "reinforce_plus_plus"


class TestReinforcePlusPlusBaselineAlgorithmConformance(AlgorithmConformance):
    plugin_name = "reinforce_plus_plus_baseline"
