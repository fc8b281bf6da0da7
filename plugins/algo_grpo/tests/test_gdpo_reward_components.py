"""The gdpo step's reward stage: the reward's per-sample values named by
algorithm.gdpo_reward_keys become reward_components, in key order; a missing one is one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polyrl.api import Batch, RewardError, RewardProvider, RewardResult, build_pipeline
from polyrl.api.testing import run_stage
from polyrl.config.loader import load_config

CFG = ["recipe=tiny", "algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[acc,fmt]"]


class ScriptedReward(RewardProvider):
    """Scores each sample by its index, with extras ``acc`` = index and ``fmt`` = 10 * index."""

    def __init__(self, extras: tuple[str, ...] = ("acc", "fmt")) -> None:
        super().__init__(None)
        self.extras = extras

    def score(self, samples):
        return [
            RewardResult(
                score=float(s.index),
                extra={k: float(s.index) * (1 + 9 * (k == "fmt")) for k in self.extras},
            )
            for s in samples
        ]


class JoiningTokenizer:
    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(map(str, row)) for row in rows]


def _rollout() -> Batch:
    batch = Batch(
        {
            "responses": torch.tensor([[5, 6, 0], [7, 0, 0], [8, 9, 4]]),
            "response_mask": torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]]),
        }
    )
    batch["data_source"] = np.array(["t"] * 3, dtype=object)
    batch["ground_truth"] = np.array(["x"] * 3, dtype=object)
    batch["extra_info"] = np.array([{}] * 3, dtype=object)
    return batch


def _reward_stage(cfg):
    return build_pipeline(cfg)["reward"]


def test_components_follow_the_key_order():
    cfg = load_config(CFG)
    state = run_stage(
        _reward_stage(cfg),
        _rollout(),
        cfg=cfg,
        tokenizer=JoiningTokenizer(),
        reward=ScriptedReward(),
    )
    torch.testing.assert_close(
        state.batch["reward_components"], torch.tensor([[0.0, 0.0], [1.0, 10.0], [2.0, 20.0]])
    )
    assert state.batch["token_level_scores"][2].tolist() == [0.0, 0.0, 2.0]


def test_a_key_the_reward_does_not_return_is_one_line():
    cfg = load_config(CFG)
    with pytest.raises(RewardError, match="returned no 'fmt' for 3 of 3 samples"):
        run_stage(
            _reward_stage(cfg),
            _rollout(),
            cfg=cfg,
            tokenizer=JoiningTokenizer(),
            reward=ScriptedReward(extras=("acc",)),
        )
