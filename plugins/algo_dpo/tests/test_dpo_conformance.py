"""polyrl's conformance suites, run on every registration of polyrl-algo-dpo."""

from __future__ import annotations

from typing import Any

import torch

from polyrl.testing import AlgorithmConformance, PolicyLossConformance


class _PairLossConformance(PolicyLossConformance):
    # A preference loss has no advantages: its gradient follows the preference (test_dpo_loss).
    check_gradient_sign = False

    def extra_fields(self, rows: int, length: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(1)
        return {"ref_log_prob": -torch.rand(rows, length, generator=gen) * 3}


class TestDpoLossConformance(_PairLossConformance):
    plugin_name = "dpo"


class TestIpoLossConformance(_PairLossConformance):
    plugin_name = "ipo"


class TestDpoAlgorithmConformance(AlgorithmConformance):
    plugin_name = "dpo"

    def overrides(self) -> list[str]:
        return ["recipe=dpo"]
