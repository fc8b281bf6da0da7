"""polyrl's conformance suites, run on every registration of polyrl-algo-ppo."""

from polyrl.testing import AdvantageEstimatorConformance, AlgorithmConformance


class TestGaeConformance(AdvantageEstimatorConformance):
    plugin_name = "gae"


class TestDiscountedGaeConformance(AdvantageEstimatorConformance):
    plugin_name = "gae"
    config_overrides = {"gamma": 0.99, "lam": 0.95}


class TestPpoAlgorithmConformance(AlgorithmConformance):
    plugin_name = "ppo"


class TestPpoRecipeAlgorithmConformance(AlgorithmConformance):
    """recipe=ppo with a critic warm-up and the KL penalty in the reward: every stage in."""

    plugin_name = "ppo"

    def overrides(self) -> list[str]:
        return ["recipe=ppo", "trainer.critic_warmup=3", "algorithm.use_kl_in_reward=true"]
