"""DAPO's soft overlong punishment against hand-worked values and verl's formula."""

import random

import pytest
import torch

from polyrl.batch import Batch
from polyrl.config.loader import load_config
from polyrl.step import StepState
from polyrl_algo_grpo.overlong import OverlongPenaltyStage, overlong_penalty

torch.set_num_threads(1)


def test_penalty_ramps_over_the_buffer():
    # limit 16, buffer 4: free up to 12 tokens, then -1/4 per token down to -1 at 16
    lengths = torch.tensor([0, 10, 12, 13, 15, 16])
    got = overlong_penalty(lengths, 16, 4, 1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, 0.0, -0.25, -0.75, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 16, 4, 0.5), got * 0.5)


@pytest.mark.parametrize("seed", range(3))
def test_penalty_equals_verls_formula(seed):
    rnd = random.Random(seed)
    limit, buffer, factor = 64, rnd.randint(1, 32), rnd.uniform(0.1, 2.0)
    lengths = [rnd.randint(0, limit) for _ in range(20)]
    # verl's DAPO reward manager: min(-(length - (limit - buffer)) / buffer * factor, 0)
    expected = [min(-(n - (limit - buffer)) / buffer * factor, 0) for n in lengths]
    got = overlong_penalty(torch.tensor(lengths), limit, buffer, factor)
    assert got.tolist() == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_stage_adds_the_penalty_to_score_and_reward_on_the_last_token():
    cfg = load_config(
        [
            "recipe=tiny",
            "data.max_response_length=4",
            "reward_model.overlong_buffer.enable=true",
            "reward_model.overlong_buffer.len=2",
            "reward_model.overlong_buffer.penalty_factor=0.5",
        ]
    )
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    scores = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0]])
    rewards = scores - 0.01 * mask  # as after a KL term: rewards may differ from scores
    batch = Batch(
        {"response_mask": mask, "token_level_scores": scores, "token_level_rewards": rewards}
    )
    state = StepState(step=1, batch=batch)
    OverlongPenaltyStage(cfg).run(state, ctx=None)
    # lengths 4, 3, 2 over a limit of 4 with buffer 2: exceed 2, 1, 0 -> -0.5, -0.25, 0
    penalty = torch.tensor([[0, 0, 0, -0.5], [0, 0, -0.25, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(state.batch["token_level_scores"], scores + penalty)
    torch.testing.assert_close(state.batch["token_level_rewards"], rewards + penalty)
    assert state.metrics["overlong/penalized_frac"] == pytest.approx(2 / 3)
    assert state.metrics["overlong/penalty_mean"] == pytest.approx(-0.25)


def test_max_resp_len_moves_the_buffer_as_verls_dapo_manager():
    """verl: expected_len = max_resp_len - len; penalty min(-(n - expected_len) / len * f, 0)."""
    cfg = load_config(
        [
            "recipe=tiny",
            "data.max_response_length=4",
            "reward_model.overlong_buffer.enable=true",
            "reward_model.overlong_buffer.len=2",
            "reward_model.overlong_buffer.max_resp_len=3",
        ]
    )
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]])
    zeros = torch.zeros(mask.shape)
    batch = Batch(
        {"response_mask": mask, "token_level_scores": zeros, "token_level_rewards": zeros}
    )
    state = StepState(step=1, batch=batch)
    OverlongPenaltyStage(cfg).run(state, ctx=None)
    # lengths 4, 3, 1; expected_len 3 - 2 = 1: exceed 3, 2, 0 -> -1.5, -1.0, 0
    last = state.batch["token_level_scores"].sum(-1)
    torch.testing.assert_close(last, torch.tensor([-1.5, -1.0, 0.0]))
