"""Dynamic sampling's parts: the filter metric, which groups are kept, how many a step trains on,
and how rounds of prompts and rollouts are joined without shifting the prompt/response boundary."""

import numpy as np
import pytest
import torch

from polyrl.batch import Batch
from polyrl.errors import ConfigError
from polyrl.interfaces import RewardResult
from polyrl_algo_grpo.group_filter import first_groups, groups_with_spread, metric_values
from polyrl_algo_grpo.rollout_rounds import PromptStream, concat_rounds, prompt_width

PAD = 0


def test_groups_with_equal_values_are_dropped_and_singletons_kept():
    uids = np.array(["a", "b", "a", "c", "b", "a", "d"], dtype=object)
    values = np.array([1.0, 0.5, 1.0, 0.3, 0.5, 0.0, 2.0])
    # a: [1, 1, 0] spread -> kept; b: [0.5, 0.5] equal -> dropped; c: [0.3] and d: [2.0] are
    # singletons -> kept
    verdict = groups_with_spread(uids, values)
    assert (verdict.kept, verdict.dropped) == (3, 1)
    assert verdict.keep_rows.tolist() == [True, False, True, True, False, True, True]


def test_equal_floats_are_equal_even_where_a_std_would_round_above_zero():
    values = np.array([0.1, 0.1, 0.1])
    assert np.std(values) > 0  # float rounding: verl's std > 0 test would keep this group
    assert groups_with_spread(np.array(["g"] * 3, dtype=object), values).dropped == 1


def _scored_batch():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return Batch(
        {
            "response_mask": mask,
            "token_level_scores": torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.5]]),
            "token_level_rewards": torch.tensor([[0.1, 1.0, 0.0], [0.0, 0.0, 0.25]]),
        }
    )


def test_metric_values_by_name():
    batch = _scored_batch()
    results = [RewardResult(1.0, {"acc": 1.0}), RewardResult(0.5, {"acc": 0.0})]
    assert metric_values(batch, results, "seq_reward").tolist() == [1.0, 0.5]
    assert metric_values(batch, results, "seq_final_reward").tolist() == pytest.approx([1.1, 0.25])
    assert metric_values(batch, results, "score").tolist() == [1.0, 0.5]
    assert metric_values(batch, results, "acc").tolist() == [1.0, 0.0]


def test_metric_errors_name_the_key_and_the_choices():
    batch = _scored_batch()
    results = [RewardResult(1.0, {"digit_frac": 1.0}), RewardResult(0.5, {"digit_frac": 0.5})]
    with pytest.raises(ConfigError, match=r"metric='acc'.*returns \['digit_frac'\]"):
        metric_values(batch, results, "acc")
    with pytest.raises(ConfigError, match=r"scored 1 of 2.*seq_reward"):
        metric_values(batch, results[:1], "score")


def test_first_groups_are_whole_and_split_over_the_ranks():
    uids = np.array(["a", "a", "a", "b", "b", "b", "c", "c", "c"], dtype=object)
    assert first_groups(uids, 3, 1).tolist() == list(range(9))
    assert first_groups(uids, 2, 1).tolist() == [0, 1, 2, 3, 4, 5]
    # 3 groups of 3 rows over 2 ranks: 9 rows do not split, 6 do
    assert first_groups(uids, 3, 2).tolist() == [0, 1, 2, 3, 4, 5]
    assert first_groups(uids[:3], 1, 2).tolist() == []


def _prompts(token_lists, first_id=0):
    """A left-padded prompt batch, as the data loader collates it."""
    width = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), width), PAD)
    mask = torch.zeros(len(token_lists), width, dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        ids[row, width - len(tokens) :] = torch.tensor(tokens)
        mask[row, width - len(tokens) :] = 1
    index = np.arange(first_id, first_id + len(token_lists))
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        },
        {"index": index},
    )


def _rollout(prompts, responses):
    """``prompts`` followed by right-padded ``responses`` (one per prompt), as a rollout returns."""
    width = max(len(r) for r in responses)
    resp = torch.full((len(responses), width), PAD)
    rmask = torch.zeros(len(responses), width, dtype=torch.long)
    for row, tokens in enumerate(responses):
        resp[row, : len(tokens)] = torch.tensor(tokens)
        rmask[row, : len(tokens)] = 1
    mask = torch.cat([prompts["attention_mask"], rmask], dim=1)
    return Batch(
        {
            "input_ids": torch.cat([prompts["input_ids"], resp], dim=1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": resp,
            "response_mask": rmask,
        },
        dict(prompts.non_tensors),
    )


def _split(batch, row):
    """(prompt tokens, response tokens) of ``row``, found the way the engines find them."""
    boundary = prompt_width(batch)
    ids, mask = batch["input_ids"][row], batch["attention_mask"][row]
    prompt = ids[:boundary][mask[:boundary] == 1].tolist()
    response = ids[boundary:][mask[boundary:] == 1].tolist()
    assert response == batch["responses"][row][batch["response_mask"][row] == 1].tolist()
    return prompt, response


def test_concat_rounds_keeps_every_prompt_and_response_in_place():
    narrow = _rollout(_prompts([[5, 6], [7]]), [[20, 21, 22], [23]])
    wide = _rollout(_prompts([[8, 9, 10, 11]], first_id=2), [[24]])
    joined = concat_rounds([narrow, Batch(), wide], PAD)
    assert prompt_width(joined) == 4 and joined["responses"].shape[1] == 3
    expected = [([5, 6], [20, 21, 22]), ([7], [23]), ([8, 9, 10, 11], [24])]
    assert [_split(joined, row) for row in range(3)] == expected
    # the real tokens keep their positions (0 at each row's first token)
    real = [joined["position_ids"][r][joined["attention_mask"][r] == 1].tolist() for r in range(3)]
    assert real == [[0, 1, 2, 3, 4], [0, 1], [0, 1, 2, 3, 4]]


def test_prompt_stream_serves_rounds_of_any_size_in_loader_order():
    draws = []

    def draw(count):
        start = 3 + sum(draws)
        draws.append(count)
        return _prompts([[100 + i] * (1 + i % 3) for i in range(start, start + count)], start)

    first = _prompts([[100], [101, 101], [102, 102, 102]])
    stream = PromptStream(first, draw, PAD)
    assert stream.take(2)["index"].tolist() == [0, 1]  # from the step's own batch
    got = stream.take(4)  # one left, three drawn
    assert draws == [3] and got["index"].tolist() == [2, 3, 4, 5]
    rows = [got["input_ids"][r][got["attention_mask"][r] == 1].tolist() for r in range(4)]
    assert rows == [[102] * 3, [103], [104, 104], [105] * 3]
    assert stream.take(1)["index"].tolist() == [6] and draws == [3, 1]
