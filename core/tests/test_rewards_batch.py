"""verl's ``batch`` reward manager: the custom function called once per batch with lists and
``reward_model.reward_kwargs``, as verl's BatchRewardManager calls it."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from polyrl.errors import ConfigError
from polyrl.interfaces.reward import RewardContext, RewardSample
from polyrl.rewards.batch import BatchRewardProvider

BATCHED = """
CALLS = []


def compute_score(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):
    CALLS.append(len(solution_strs))
    out = []
    for source, text, truth, extra in zip(data_sources, solution_strs, ground_truths, extra_infos):
        score = float(text == truth) + bonus
        out.append({"score": score, "length": len(text)} if source == "dict" else score)
    return out


def too_few(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
    return [1.0]
"""


@pytest.fixture(scope="module")
def reward_model():
    """The run's ``reward_model`` node, as composed from verl's command line."""
    from polyrl.config import load_config

    verl = ["reward_model.reward_manager=batch", "+reward_model.reward_kwargs.bonus=0.5"]
    return load_config(verl).reward_model


def _provider(tmp_path: Path, reward_model, name: str = "compute_score", **over):
    path = tmp_path / "batched.py"
    path.write_text(BATCHED)
    ctx = RewardContext(
        reward_model=OmegaConf.merge(reward_model, over),
        custom_reward_function={"path": str(path), "name": name},
    )
    return BatchRewardProvider(ctx)


def _samples() -> list[RewardSample]:
    return [
        RewardSample(0, "plain", "7", "7"),
        RewardSample(1, "dict", "12", "13", {"split": "train"}),
    ]


def test_one_call_scores_the_batch_with_reward_kwargs(tmp_path: Path, reward_model) -> None:
    provider = _provider(tmp_path, reward_model)
    results = provider.score(_samples())
    assert [(r.score, r.extra, r.error) for r in results] == [
        (1.5, {}, None),
        (0.5, {"length": 2.0}, None),
    ]
    assert provider.fn.__globals__["CALLS"] == [2]


def test_a_wrong_number_of_scores_fails_the_batch(tmp_path: Path, reward_model) -> None:
    results = _provider(tmp_path, reward_model, "too_few", failure_score=-1.0).score(_samples())
    assert [r.score for r in results] == [-1.0, -1.0]
    assert "returned 1 scores for 2 samples" in str(results[0].error)
    with pytest.raises(ValueError, match="returned 1 scores"):
        _provider(tmp_path, reward_model, "too_few", on_error="raise").score(_samples())


def test_it_needs_a_custom_function() -> None:
    ctx = RewardContext(reward_model={"reward_manager": "batch"}, custom_reward_function={})
    with pytest.raises(ConfigError, match=r"set custom_reward_function\.path"):
        BatchRewardProvider(ctx)
