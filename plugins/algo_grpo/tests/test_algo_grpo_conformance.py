"""polyrl's conformance suites, run on every registration of polyrl-algo-grpo."""

from typing import Any

import torch

from polyrl.api import Batch
from polyrl.api.testing import schema_config
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


class TestGrpoVectorizedConformance(AdvantageEstimatorConformance):
    plugin_name = "grpo_vectorized"


class TestRlooVectorizedConformance(AdvantageEstimatorConformance):
    plugin_name = "rloo_vectorized"


class TestGrpoPasskConformance(AdvantageEstimatorConformance):
    plugin_name = "grpo_passk"


class TestOpoConformance(AdvantageEstimatorConformance):
    plugin_name = "opo"


class TestGpgConformance(AdvantageEstimatorConformance):
    plugin_name = "gpg"


class TestGdpoConformance(AdvantageEstimatorConformance):
    plugin_name = "gdpo"

    def estimator_config(self) -> Any:
        return schema_config().algorithm  # with GDPO's section (weights: null, 1 each)

    def extra_fields(self, rows: int, length: int) -> dict[str, Any]:
        return {"reward_components": torch.zeros(rows, 2)}

    def run(self, implementation: Any, batch: Any) -> Any:
        """Where the suite sets rewards, two reward dimensions made from them (the score and its
        square), so its rule for equal rewards in a group (zero advantage) applies."""
        if "token_level_rewards" in batch:
            score = batch["token_level_rewards"].sum(dim=-1)
            components = torch.stack([score, score.square()], dim=-1)
            tensors = {**batch.tensors, "reward_components": components}
            batch = Batch(tensors, non_tensors=dict(batch.non_tensors))
        return super().run(implementation, batch)


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


class TestGdpoAlgorithmConformance(AlgorithmConformance):
    plugin_name = "gdpo"

    def overrides(self) -> list[str]:
        return ["recipe=tiny", "algorithm.name=gdpo", "algorithm.gdpo_reward_keys=[acc]"]


class TestDapoAlgorithmConformance(AlgorithmConformance):
    plugin_name = "dapo"


class TestDapoRecipeAlgorithmConformance(AlgorithmConformance):
    """recipe=dapo with the overlong buffer: dynamic sampling around gen, reward and the
    overlong penalty."""

    plugin_name = "dapo"

    def overrides(self) -> list[str]:
        return [
            "recipe=dapo",
            "reward_model.overlong_buffer.enable=true",
            "reward_model.overlong_buffer.len=4",
        ]


class TestDapoWithoutFilteringAlgorithmConformance(AlgorithmConformance):
    plugin_name = "dapo"

    def overrides(self) -> list[str]:
        return ["recipe=dapo", "algorithm.filter_groups.enable=false", "data.gen_batch_size=8"]
