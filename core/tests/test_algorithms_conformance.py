"""The built-in ``vanilla`` policy loss and ``policy_gradient`` algorithm through polyrl's own
conformance suites."""

from polyrl.testing import AlgorithmConformance, PolicyLossConformance


class TestVanillaPolicyLossConformance(PolicyLossConformance):
    plugin_name = "vanilla"


class TestVanillaClipHigherConformance(PolicyLossConformance):
    plugin_name = "vanilla"
    config_overrides = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}


class TestPolicyGradientAlgorithmConformance(AlgorithmConformance):
    plugin_name = "policy_gradient"
