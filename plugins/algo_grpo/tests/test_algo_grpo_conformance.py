"""polyrl's conformance suites, run on every registration of polyrl-algo-grpo."""

from polyrl.testing import (
    AdvantageEstimatorConformance,
    AlgorithmConformance,
    PolicyLossConformance,
)


class TestGrpoConformance(AdvantageEstimatorConformance):
    plugin_name = "grpo"


class TestGrpoWithoutStdConformance(AdvantageEstimatorConformance):
    plugin_name = "grpo"
    config_overrides = {"norm_adv_by_std_in_grpo": False}


class TestDrGrpoConformance(AdvantageEstimatorConformance):
    plugin_name = "drgrpo"


class TestDrGrpoAliasConformance(AdvantageEstimatorConformance):
    plugin_name = "dr_grpo"


class TestRlooConformance(AdvantageEstimatorConformance):
    plugin_name = "rloo"


class TestGspoConformance(PolicyLossConformance):
    plugin_name = "gspo"


class TestGspoPaperClipConformance(PolicyLossConformance):
    plugin_name = "gspo"
    config_overrides = {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}


class TestGrpoAlgorithmConformance(AlgorithmConformance):
    plugin_name = "grpo"


class TestDrGrpoAlgorithmConformance(AlgorithmConformance):
    plugin_name = "drgrpo"


class TestRlooAlgorithmConformance(AlgorithmConformance):
    plugin_name = "rloo"


class TestDapoAlgorithmConformance(AlgorithmConformance):
    plugin_name = "dapo"


class TestDapoRecipeAlgorithmConformance(AlgorithmConformance):
    """recipe=dapo: dynamic sampling around gen, reward and the overlong penalty."""

    plugin_name = "dapo"

    def overrides(self) -> list[str]:
        return ["recipe=dapo"]


class TestDapoWithoutFilteringAlgorithmConformance(AlgorithmConformance):
    plugin_name = "dapo"

    def overrides(self) -> list[str]:
        return ["recipe=dapo", "algorithm.filter_groups.enable=false", "data.gen_batch_size=8"]
