"""The template plugin: the polyrl conformance suites plus values derived by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.config import load_config
from polyrl.errors import ConfigError
from polyrl.interfaces import RewardContext, RewardSample
from polyrl.specs import PluginKind
from polyrl.testing import AdvantageEstimatorConformance, RewardProviderConformance
from polyrl_plugin_template.estimator import reinforce_batch_baseline
from polyrl_plugin_template.reward import KeywordReward


class TestReinforceConformance(AdvantageEstimatorConformance):
    plugin_name = "template_reinforce"


class TestKeywordConformance(RewardProviderConformance):
    plugin_name = "template_keyword"

    def make_samples(self) -> list[RewardSample]:
        answers = ["The answer is Paris.", "paris", "Parisian cafes", "x" * 500 + " Paris"]
        return [
            RewardSample(index=i, data_source="capitals", solution_str=a, ground_truth="Paris")
            for i, a in enumerate(answers)
        ]

    def expected_scores(self) -> list[float]:
        # matched, matched (case-insensitive), not a whole word, matched but 506 chars:
        # 106 over the 400 budget at 0.001 each.
        return [1.0, 1.0, 0.0, 1.0 - 0.106]


# ---- the estimator by hand ---------------------------------------------------------------------
REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 3.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
INDEX = np.array(["a", "a", "b", "b"], dtype=object)


def _estimate(*overrides: str) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = load_config(list(overrides))
    batch = Batch({"token_level_rewards": REWARDS, "response_mask": MASK}, {"uid": INDEX})
    return reinforce_batch_baseline(batch, cfg.algorithm)


def test_batch_mean_baseline_by_hand() -> None:
    # scores 1, 3, 2, 0 -> mean 1.5 -> advantages -0.5, 1.5, 0.5, -1.5 on each row's real tokens.
    advantages, returns = _estimate()
    expected = torch.tensor([[-0.5, -0.5, -0.5], [1.5, 1.5, 0.0], [0.5, 0.0, 0.0], [-1.5] * 3])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected)


def test_leave_one_out_baseline_by_hand() -> None:
    # baseline of row i = (6 - s_i) / 3: 5/3, 1, 4/3, 2 -> advantages -2/3, 2, 2/3, -2.
    advantages, _ = _estimate("plugins.template_reinforce.leave_one_out=true")
    torch.testing.assert_close(advantages[:, 0], torch.tensor([-2 / 3, 2.0, 2 / 3, -2.0]))


def test_normalized_by_batch_std_by_hand() -> None:
    # unbiased std of (1, 3, 2, 0) = sqrt(5/3); advantages (s - 1.5) / sqrt(5/3).
    advantages, _ = _estimate("plugins.template_reinforce.normalize=true")
    std = (5 / 3) ** 0.5
    expected = torch.tensor([-0.5, 1.5, 0.5, -1.5]) / (std + 1e-6)
    torch.testing.assert_close(advantages[:, 0], expected)


def test_misspelled_setting_is_rejected_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"Did you mean plugins\.template_reinforce\.normalize"):
        _estimate("plugins.template_reinforce.normalise=true")


# ---- the reward by hand ------------------------------------------------------------------------
def _reward(**settings: object) -> KeywordReward:
    cfg = load_config([f"plugins.template_keyword.{k}={v}" for k, v in settings.items()])
    return KeywordReward(RewardContext(cfg.reward_model, cfg.custom_reward_function))


def test_length_penalty_is_capped_and_case_sensitivity_is_a_setting() -> None:
    reward = _reward(max_chars=10, penalty_per_char=0.1, max_penalty=0.3, case_sensitive=True)
    samples = [
        RewardSample(index=0, data_source="t", solution_str="42", ground_truth="42"),
        RewardSample(index=1, data_source="t", solution_str="it is 42 ok", ground_truth="42"),
        RewardSample(index=2, data_source="t", solution_str="y" * 30, ground_truth="42"),
        RewardSample(index=3, data_source="t", solution_str="paris", ground_truth="Paris"),
        RewardSample(index=4, data_source="t", solution_str="420", ground_truth="42"),
    ]
    results = reward.score(samples)
    # 11 chars: 1 over -> 0.1; 30 chars: 20 over -> 2.0, capped at 0.3; case differs; 420 != 42.
    assert [r.score for r in results] == pytest.approx([1.0, 0.9, -0.3, 0.0, 0.0])
    assert results[1].extra == pytest.approx({"matched": 1.0, "length_penalty": 0.1})


def test_validate_accepts_the_plugin_and_checks_its_section(polyrl_registry, tmp_path) -> None:
    from polyrl.config.validate import validate_config

    cfg = load_config(
        [
            "algorithm.adv_estimator=template_reinforce",
            "reward_model.reward_manager=template_keyword",
            "plugins.template_keyword.max_chars=100",
            "plugins.template_keyword.max_char=100",
        ]
    )
    problems = validate_config(cfg, polyrl_registry)
    assert not any("algorithm.adv_estimator" in p for p in problems), problems
    assert not any("reward_model.reward_manager" in p for p in problems), problems
    assert any(
        "plugins.template_keyword.max_char" in p and "Did you mean" in p for p in problems
    ), problems
    assert polyrl_registry.get(PluginKind.ADVANTAGE_ESTIMATOR, "template_reinforce")
    assert OmegaConf.select(cfg, "plugins.template_keyword.max_chars") == 100
