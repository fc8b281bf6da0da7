"""Mini-batch planning from the batch the update actually has."""

from __future__ import annotations

import numpy as np
import pytest

from polyrl.step.minibatch import MiniBatchError, minibatch_sizes, plan_minibatches


def plan(num_rows, dp=2, per_mini=16, epochs=1, shuffle=False, step=1, seed=1):
    return plan_minibatches(
        num_rows, dp, per_mini, epochs=epochs, shuffle=shuffle, seed=seed, step=step
    )


def test_full_batch_splits_into_configured_minibatches():
    p = plan(64, dp=2, per_mini=16)  # 32 local rows, 8 per mini-batch
    assert [len(m) for m in p.epochs[0]] == [8, 8, 8, 8]
    assert np.array_equal(np.concatenate(p.epochs[0]), np.arange(32))
    assert p.optimizer_steps == 4 and not p.on_policy


def test_a_shrunken_batch_gets_near_equal_minibatches_not_a_ragged_tail():
    assert minibatch_sizes(24, 16) == [12, 12]
    assert minibatch_sizes(10, 4) == [4, 3, 3]
    assert minibatch_sizes(3, 8) == [3]


def test_one_minibatch_one_epoch_is_on_policy_whatever_the_batch_size():
    assert plan(16, dp=2, per_mini=16).on_policy
    assert plan(12, dp=2, per_mini=16).on_policy  # filtered down: still one optimizer step
    assert not plan(16, dp=2, per_mini=16, epochs=2).on_policy


def test_uneven_split_over_ranks_is_a_clear_error():
    with pytest.raises(MiniBatchError, match="7 rows cannot be split evenly over 2"):
        plan(7, dp=2)


def test_empty_batch_is_an_error():
    with pytest.raises(MiniBatchError, match="empty batch"):
        plan(0)


def test_shuffle_differs_between_steps_and_epochs_and_repeats_after_resume():
    a = plan(64, per_mini=16, epochs=2, shuffle=True, step=1)
    b = plan(64, per_mini=16, epochs=2, shuffle=True, step=2)
    again = plan(64, per_mini=16, epochs=2, shuffle=True, step=1)
    flat = [np.concatenate(e) for e in a.epochs]
    assert not np.array_equal(flat[0], flat[1])  # epochs differ
    assert not np.array_equal(flat[0], np.concatenate(b.epochs[0]))  # steps differ
    assert all(
        np.array_equal(x, y) for x, y in zip(flat, [np.concatenate(e) for e in again.epochs])
    )
    for order in flat:
        assert sorted(order.tolist()) == list(range(32))  # a permutation of the shard
