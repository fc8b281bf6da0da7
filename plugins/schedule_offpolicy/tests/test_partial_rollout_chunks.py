"""The chunk bookkeeping of partial rollouts, by hand: which tokens a continuation sends, what a
chunk appends (ids, log-probs bit for bit, versions), when a sample is finished, what an abort
throws away, the assembled batch, and a checkpoint round trip. No Ray, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from polyrl.api import Batch, StepState, load_step_state, save_step_state
from polyrl_schedule_offpolicy.chunks import TOKEN_VERSION_KEY, PartialSamples
from polyrl_schedule_offpolicy.partial_rollout import (
    StalenessError,
    oldest_token_versions,
    token_staleness_metrics,
)

PAD, EOS = 9, 2


def prompts() -> Batch:
    """Two prompts, left-padded: [5, 6] and [7]."""
    return Batch(
        {
            "input_ids": torch.tensor([[5, 6], [PAD, 7]]),
            "attention_mask": torch.tensor([[1, 1], [0, 1]]),
        }
    )


def chunk(rows: list[list[int]], log_probs: list[list[float]], budget: int) -> Batch:
    """What an engine returns for a chunk: responses right-padded to ``budget``."""
    responses = torch.full((len(rows), budget), PAD)
    mask = torch.zeros((len(rows), budget), dtype=torch.long)
    lps = torch.zeros((len(rows), budget))
    for i, (tokens, lp) in enumerate(zip(rows, log_probs, strict=True)):
        responses[i, : len(tokens)] = torch.tensor(tokens)
        mask[i, : len(tokens)] = 1
        lps[i, : len(tokens)] = torch.tensor(lp)
    return Batch({"responses": responses, "response_mask": mask, "rollout_log_probs": lps})


def test_a_continuation_is_the_prompt_and_the_sampled_ids_left_padded() -> None:
    samples = PartialSamples.start(prompts(), n=2, max_new_tokens=6)
    assert samples.unfinished() == [0, 1, 2, 3] and samples.budget(4) == 4
    first = samples.continuation([0, 1, 2, 3], PAD)
    assert first["input_ids"].tolist() == [[5, 6], [5, 6], [PAD, 7], [PAD, 7]]
    assert first["attention_mask"].tolist() == [[1, 1], [1, 1], [0, 1], [0, 1]]
    samples.tokens[1], samples.tokens[2] = [11, 12, 13], [14, 15, 16]
    second = samples.continuation([1, 2], PAD)
    assert second["input_ids"].tolist() == [[5, 6, 11, 12, 13], [PAD, 7, 14, 15, 16]]
    assert second["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]


def test_chunks_append_ids_log_probs_and_versions_and_finish_samples() -> None:
    samples = PartialSamples.start(prompts(), n=2, max_new_tokens=6)
    # chunk 1 by version 3, budget 3: row 0 stops early (EOS), row 1 ends exactly on EOS at the
    # budget, rows 2 and 3 use the whole budget
    lp = [-0.1, -0.2, -0.3]
    out = chunk([[20, EOS], [21, 22, EOS], [23, 24, 25], [26, 27, 28]], [lp[:2], lp, lp, lp], 3)
    samples.record([0, 1, 2, 3], out, budget=3, version=3, stop_token_ids={EOS})
    assert samples.done == [True, True, False, False] and samples.unfinished() == [2, 3]
    assert samples.budget(4) == 3  # 6 - 3 left
    # chunk 2 by version 4: row 2 stops, row 3 reaches max_new_tokens
    out = chunk([[29, EOS], [30, 31, 32]], [[-1.5, -2.5], [-0.125, -0.25, -0.5]], 3)
    samples.record([2, 3], out, budget=3, version=4, stop_token_ids={EOS})
    assert samples.complete() and samples.chunks == 2
    assert samples.tokens[2] == [23, 24, 25, 29, EOS]
    assert samples.versions[3] == [3, 3, 3, 4, 4, 4]

    batch = samples.assemble(PAD)
    assert batch["responses"].tolist() == [
        [20, EOS, PAD, PAD, PAD, PAD],
        [21, 22, EOS, PAD, PAD, PAD],
        [23, 24, 25, 29, EOS, PAD],
        [26, 27, 28, 30, 31, 32],
    ]
    assert batch["response_mask"].sum(-1).tolist() == [2, 3, 5, 6]
    assert batch[TOKEN_VERSION_KEY].tolist() == [
        [3, 3, -1, -1, -1, -1],
        [3, 3, 3, -1, -1, -1],
        [3, 3, 3, 4, 4, -1],
        [3, 3, 3, 4, 4, 4],
    ]
    # the engine's float32 log-probs, bit for bit, in their places
    expected = torch.tensor([-0.1, -0.2, -0.3, -1.5, -2.5, 0.0])
    assert torch.equal(batch["rollout_log_probs"][2], expected)
    assert batch["prompts"].tolist() == [[5, 6], [5, 6], [PAD, 7], [PAD, 7]]
    assert batch["input_ids"][2].tolist() == [PAD, 7, 23, 24, 25, 29, EOS, PAD]
    assert oldest_token_versions(batch[TOKEN_VERSION_KEY]).tolist() == [3, 3, 3, 3]


def test_an_abort_restarts_only_samples_that_had_begun() -> None:
    samples = PartialSamples.start(prompts(), n=1, max_new_tokens=8)
    out = chunk([[20, EOS], [21, 22]], [[-1.0, -1.0], [-1.0, -1.0]], 2)
    samples.record([0, 1], out, budget=2, version=0, stop_token_ids={EOS})
    assert samples.abort_unfinished() == 1 and samples.aborted == 1
    assert samples.tokens == [[20, EOS], []] and samples.versions[1] == []
    assert samples.abort_unfinished() == 0  # nothing sampled since: nothing thrown away
    samples.restart()
    assert samples.tokens == [[], []] and samples.unfinished() == [0, 1] and samples.aborted == 2


def test_an_engine_that_overruns_the_budget_is_refused() -> None:
    samples = PartialSamples.start(prompts(), n=1, max_new_tokens=8)
    out = chunk([[20, 21, 22], [23]], [[0.0] * 3, [0.0]], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        samples.record([0, 1], out, budget=2, version=0, stop_token_ids={EOS})


def test_partial_samples_survive_a_checkpoint_bit_for_bit(tmp_path: Path) -> None:
    samples = PartialSamples.start(prompts(), n=2, max_new_tokens=6)
    lps = [[0.1 * i, -1 / 3] for i in range(4)]
    out = chunk([[20, EOS], [21, 22], [23, 24], [25, 26]], lps, 2)
    samples.record([0, 1, 2, 3], out, budget=2, version=7, stop_token_ids={EOS})
    samples.abort_unfinished()
    out = chunk([[27, 28], [29, 30], [31, EOS]], [[-0.7, -0.9]] * 3, 2)
    samples.record([1, 2, 3], out, budget=2, version=8, stop_token_ids={EOS})
    holder = prompts().select_rows([])
    holder.meta = {"partial": samples.state_dict()}
    save_step_state(str(tmp_path / "p.pt"), StepState(step=3, batch=holder))
    loaded = PartialSamples.from_state_dict(
        prompts(), load_step_state(str(tmp_path / "p.pt")).batch.meta["partial"]
    )
    assert loaded.state_dict() == samples.state_dict()
    assert torch.equal(
        torch.tensor(loaded.log_probs[0], dtype=torch.float32),
        torch.tensor(samples.log_probs[0], dtype=torch.float32),
    )
    assert loaded.unfinished() == [1, 2] and loaded.aborted == 3


def test_token_staleness_is_per_token_and_bounded() -> None:
    versions = torch.tensor([[3, 3, 4, -1], [4, 4, 4, 4]])
    batch = Batch({TOKEN_VERSION_KEY: versions})
    metrics = token_staleness_metrics(batch, actor_version=5, bound=2)
    # staleness of the 7 tokens: 2, 2, 1, 1, 1, 1, 1
    assert metrics == {"async/token_staleness/mean": 9 / 7, "async/token_staleness/max": 2.0}
    with pytest.raises(StalenessError, match="max_off_policy_threshold=1"):
        token_staleness_metrics(batch, actor_version=5, bound=1)
    with pytest.raises(StalenessError):
        token_staleness_metrics(batch, actor_version=3, bound=2)  # a token from the future
