"""PF-PPO (verl's ``algorithm.use_pf_ppo``): the sampling weights against verl's formulas on
hand-made scores, the stage's place in PPO's step, and the resampled batch (same size, seeded,
rows drawn by their scores)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from polyrl.api import build_pipeline
from polyrl.batch import Batch
from polyrl.config.loader import load_config
from polyrl.step import StepState
from polyrl_algo_ppo.checks import check_config
from polyrl_algo_ppo.pf_ppo import PfPpoStage, pf_ppo_weights

SCORES = torch.tensor([1.0, -2.0, 0.5, 1.0, -2.0, 0.0])


@pytest.fixture(scope="module")
def cfg():
    return load_config(["recipe=ppo", "algorithm.use_pf_ppo=true"])


def test_weights_are_verls() -> None:
    # verl: pow |s|**p; max_min 1 at the max and the min; max_random 0.4 at the max, else 0.1;
    # every weight + 1e-8
    eps = 1e-8
    torch.testing.assert_close(
        pf_ppo_weights(SCORES, "pow", 2.0), torch.tensor([1.0, 4.0, 0.25, 1.0, 4.0, 0.0]) + eps
    )
    torch.testing.assert_close(
        pf_ppo_weights(SCORES, "max_min", 2.0), torch.tensor([1.0, 1, 0, 1, 1, 0]) + eps
    )
    torch.testing.assert_close(
        pf_ppo_weights(SCORES, "max_random", 2.0),
        torch.tensor([0.4, 0.1, 0.1, 0.4, 0.1, 0.1]) + eps,
    )
    with pytest.raises(ValueError, match="reweight_method='best'"):
        pf_ppo_weights(SCORES, "best", 2.0)


def test_the_stage_runs_after_the_advantages_only_when_asked(cfg) -> None:
    names = build_pipeline(cfg).names()
    assert names[names.index("adv") + 1 : names.index("adv") + 3] == ["pf_ppo", "update_critic"]
    assert build_pipeline(cfg).check() == []
    off = OmegaConf.merge(cfg, {"algorithm": {"use_pf_ppo": False}})
    assert "pf_ppo" not in build_pipeline(off).names()


def _resampled(cfg, step: int, method: str) -> Batch:
    scores = torch.zeros(6, 3)
    scores[:, -1] = SCORES
    batch = Batch(
        {"token_level_scores": scores, "advantages": torch.arange(6.0)[:, None]},
        {"uid": np.array(list("abcdef"), dtype=object)},
    )
    state = StepState(step=step, batch=batch)
    stage = PfPpoStage(cfg)
    stage.method = method
    stage.run(state, None)  # type: ignore[arg-type]
    assert state.metrics["pf_ppo/distinct_rows"] >= 1
    return state.batch


def test_the_batch_is_resampled_by_score_and_seeded(cfg) -> None:
    batch = _resampled(cfg, 3, "max_min")
    assert len(batch) == 6
    rows = batch["advantages"][:, 0].long()
    # max_min: only the rows scored 1.0 or -2.0 (0, 1, 3, 4) carry weight
    assert set(rows.tolist()) <= {0, 1, 3, 4}
    assert list(batch.non_tensors["uid"]) == [list("abcdef")[r] for r in rows]
    assert torch.equal(_resampled(cfg, 3, "max_min")["advantages"], batch["advantages"])
    draws = {tuple(_resampled(cfg, step, "pow")["advantages"][:, 0].tolist()) for step in range(6)}
    assert len(draws) > 1  # another step, another draw


def test_a_bad_method_is_one_line(cfg) -> None:
    bad = OmegaConf.merge(cfg, {"algorithm": {"pf_ppo": {"reweight_method": "best"}}})
    (line,) = [p for p in check_config(bad) if "pf_ppo" in p]
    assert line.startswith("algorithm.pf_ppo.reweight_method")
