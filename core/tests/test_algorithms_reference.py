"""Cross-check the vectorised torch code against a plain-Python, element-by-element reading of
the same formulas, on random ragged batches (catches indexing/broadcast/masking slips that the
small hand-worked cases could miss)."""

import math
import random

import pytest
import torch

from polyrl.algorithms import LOSS_AGG_MODES, agg_loss, kl_penalty, vanilla_policy_loss
from polyrl.batch import Batch
from polyrl.testing.configs import actor_config

torch.set_num_threads(1)


def _ragged(seed, rows=6, width=7):
    rnd = random.Random(seed)
    lengths = [rnd.randint(1, width) for _ in range(rows)]
    mask = [[1.0 if t < n else 0.0 for t in range(width)] for n in lengths]
    old = [[-3 * rnd.random() for _ in range(width)] for _ in range(rows)]
    new = [[o + rnd.gauss(0, 0.6) for o in row] for row in old]
    adv = [[rnd.gauss(0, 1.5)] * width for _ in range(rows)]
    return mask, old, new, adv


def _ref_ppo(old, new, a, low, high, c):
    r = math.exp(max(-20.0, min(20.0, new - old)))
    loss = max(-a * r, -a * min(max(r, 1 - low), 1 + high))
    clipped = -a * min(max(r, 1 - low), 1 + high) > -a * r
    dual = a < 0 and loss > -a * c
    if a < 0:
        loss = min(loss, -a * c)
    return loss, clipped, dual


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("low", "high", "c"), [(0.2, 0.2, 3.0), (0.2, 0.28, 1.5)])
def test_vanilla_loss_matches_elementwise_reference(seed, low, high, c):
    mask, old, new, adv = _ragged(seed)
    cfg = actor_config(clip_ratio=0.2, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c)
    t = torch.tensor
    batch = Batch({"old_log_probs": t(old), "advantages": t(adv), "response_mask": t(mask)})
    loss_mat, metrics = vanilla_policy_loss(batch, t(new), cfg)
    n_tok = clip_n = dual_n = kl_sum = 0.0
    for i, row in enumerate(mask):
        for j, m in enumerate(row):
            if not m:
                assert loss_mat[i, j].item() == 0.0
                continue
            ref, clipped, dual = _ref_ppo(old[i][j], new[i][j], adv[i][j], low, high, c)
            assert loss_mat[i, j].item() == pytest.approx(ref, rel=1e-5, abs=1e-6)
            n_tok += 1
            clip_n += clipped
            dual_n += dual
            kl_sum += old[i][j] - new[i][j]
    assert float(metrics["pg_clipfrac"]) == pytest.approx(clip_n / n_tok)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(dual_n / n_tok)
    assert float(metrics["ppo_kl"]) == pytest.approx(kl_sum / n_tok, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_agg_modes_match_reference(seed):
    mask, loss, _, _ = _ragged(seed)
    width = len(mask[0])
    rows = [[v for v, m in zip(lr, mr) if m] for lr, mr in zip(loss, mask)]
    n_tokens = sum(len(r) for r in rows)
    reference = {
        "token-mean": sum(sum(r) for r in rows) / n_tokens,
        "token-sum": sum(sum(r) for r in rows),
        "seq-mean-token-sum": sum(sum(r) for r in rows) / len(rows),
        "seq-mean-token-mean": sum(sum(r) / len(r) for r in rows) / len(rows),
        "seq-mean-token-sum-norm": sum(sum(r) for r in rows) / (len(rows) * width),
    }
    for mode in LOSS_AGG_MODES:
        got = agg_loss(torch.tensor(loss), torch.tensor(mask), mode).item()
        assert got == pytest.approx(reference[mode], rel=1e-5), mode


def test_kl_kinds_match_reference():
    _, ref, logp, _ = _ragged(7)
    formulas = {
        "kl": lambda d: d,
        "abs": abs,
        "mse": lambda d: 0.5 * d * d,
        "low_var_kl": lambda d: max(-10.0, min(10.0, math.exp(-d) + d - 1)),
    }
    for kind, f in formulas.items():
        got = kl_penalty(torch.tensor(logp), torch.tensor(ref), kind)
        for i, row in enumerate(logp):
            for j, lp in enumerate(row):
                expect = f(lp - ref[i][j])
                assert got[i, j].item() == pytest.approx(expect, rel=1e-5, abs=1e-6), kind
