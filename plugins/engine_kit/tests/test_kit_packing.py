"""Padding-free packing, token-budget planning for packed micro-batches, and the fused log-probs,
each checked by hand or against the plain computation it replaces (no process group)."""

from __future__ import annotations

import pytest
import torch

from polyrl.api import ConfigError
from polyrl_engine_kit import fused_logprob
from polyrl_engine_kit.config import resolve_settings
from polyrl_engine_kit.fused_logprob import linear_log_prob, linear_scores
from polyrl_engine_kit.microbatch import packed_budget_partition, plan_micro_batches
from polyrl_engine_kit.packing import pack_rows, unpack
from polyrl_engine_kit.testing import ragged_batch

torch.set_num_threads(1)


def test_pack_rows_by_hand() -> None:
    # prompt width 3, response width 2; real tokens: row 0 = [1 2 | 3], row 1 = [4 | 5 6]
    ids = torch.tensor([[1, 2, 0, 3, 0], [0, 0, 4, 5, 6]])
    # row 0's prompt is left-padded in a real batch; here it sits at columns 0-1 with column 2 as
    # padding, which the packed layout must skip just the same.
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 1, 1, 1]])
    packed = pack_rows(ids, mask, response_width=2)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert packed.cu_seqlens.tolist() == [0, 3, 6] and packed.max_seqlen == 3
    # token 3 is predicted from packed position 1 (token 2); 5 from 3 (token 4); 6 from 4
    assert packed.score_index.tolist() == [1, 3, 4]
    assert packed.labels.tolist() == [3, 5, 6]
    assert unpack(torch.tensor([0.5, 1.5, 2.5]), packed).tolist() == [[0.5, 0.0], [1.5, 2.5]]


def test_packed_budget_partition_first_fit_decreasing() -> None:
    # rows by length 8 (row 2), 7 (row 4), 5 (row 0), 3 (row 1), 2 (row 3) into groups of <= 10:
    # 8 -> A; 7 -> B; 5 -> C; 3 -> B (7+3); 2 -> A (8+2)
    assert packed_budget_partition([5, 3, 8, 2, 7], 10, "k") == [[2, 3], [1, 4], [0]]
    assert packed_budget_partition([4, 4, 4], 12, "k") == [[0, 1, 2]]
    with pytest.raises(ConfigError, match="k=6"):
        packed_budget_partition([5, 7], 6, "k")


def test_plan_counts_real_tokens_when_packed() -> None:
    # real lengths (prompt + response): 5+4, 2+6, 4+1, 1+3 = 9, 8, 5, 4 in rows 11 wide
    batch = ragged_batch([5, 2, 4, 1], [4, 6, 1, 3], 5, 6, torch.Generator().manual_seed(0))
    settings = resolve_settings(
        {}, {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 13}, total_training_steps=1
    )
    # packed: 9 -> A, 8 -> B, 5 -> B (13), 4 -> A (13)
    assert plan_micro_batches(batch, settings, training=True, packed=True) == [[0, 3], [1, 2]]
    # padded, each group costs rows x (longest prompt + longest response): one row per group
    assert len(plan_micro_batches(batch, settings, training=True)) == 4


def _reference(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    log_p = torch.log_softmax((hidden @ weight.t()) / temperature, dim=-1)
    return log_p.gather(-1, labels[:, None])[:, 0], -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("with_entropy", [True, False])
def test_fused_log_prob_and_grads_match_log_softmax(
    with_entropy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fused_logprob, "_CHUNK_ELEMENTS", 3 * 50)  # chunks of 3 tokens
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (10,), generator=gen)
    g_lp, g_ent = torch.randn(10, generator=gen), torch.randn(10, generator=gen)

    log_prob, entropy = linear_log_prob(hidden, weight, labels, 0.7, with_entropy)
    ref_lp, ref_ent = _reference(hidden, weight, labels, 0.7)
    torch.testing.assert_close(log_prob, ref_lp.float())
    loss = (log_prob * g_lp).sum()
    ref_loss = (ref_lp * g_lp).sum()
    if with_entropy:
        assert entropy is not None
        torch.testing.assert_close(entropy, ref_ent.float())
        loss, ref_loss = loss + (entropy * g_ent).sum(), ref_loss + (ref_ent * g_ent).sum()
    grads = torch.autograd.grad(loss, (hidden, weight))
    ref_grads = torch.autograd.grad(ref_loss, (hidden, weight))
    for got, want in zip(grads, ref_grads):  # float32 statistics against a float64 reference
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_fused_sum_pi_squared_matches_softmax(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused path's sum_pi_squared (verl's formula, per chunk) against the float64 softmax;
    its log-probs and gradients are the plain path's."""
    monkeypatch.setattr(fused_logprob, "_CHUNK_ELEMENTS", 3 * 50)  # chunks of 3 tokens
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(10, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 50, (10,), generator=gen)
    scores = linear_scores(hidden, weight, labels, 0.7, with_sum_pi_squared=True)
    want = (torch.softmax((hidden @ weight.t()).detach() / 0.7, -1) ** 2).sum(-1)
    torch.testing.assert_close(scores.sum_pi_squared, want.float())
    assert not scores.sum_pi_squared.requires_grad and scores.entropy is None
    log_prob, _ = linear_log_prob(hidden, weight, labels, 0.7)
    torch.testing.assert_close(scores.log_prob, log_prob)
    (grad,) = torch.autograd.grad(scores.log_prob.sum(), hidden)
    (plain,) = torch.autograd.grad(log_prob.sum(), hidden)
    torch.testing.assert_close(grad, plain)
