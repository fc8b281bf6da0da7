"""grpo_passk, opo, gpg and gdpo against values worked out by hand (or, for GDPO's batch
whitening, a plain-Python re-implementation of verl's formula); every verl name selectable."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from polyrl.api import Batch
from polyrl.api.testing import schema_config
from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config
from polyrl_algo_grpo.gdpo import gdpo_advantage
from polyrl_algo_grpo.group_variants import gpg_advantage, grpo_passk_advantage, opo_advantage

torch.set_num_threads(1)

# group "a": scores 1, 0, 0.5 (lengths 2, 3, 1); group "b": a tie 0.2, 0.2 (lengths 2, 2)
UID = np.array(["a", "a", "a", "b", "b"], dtype=object)
SCORES = [1.0, 0.0, 0.5, 0.2, 0.2]
LENGTHS = [2, 3, 1, 2, 2]


def _mask() -> torch.Tensor:
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(3)] for n in LENGTHS])


def _on_last_token(values) -> torch.Tensor:
    out = torch.zeros(5, 3)
    for i, (v, n) in enumerate(zip(values, LENGTHS)):
        out[i, n - 1] = v
    return out


def _batch() -> Batch:
    batch = Batch({"token_level_rewards": _on_last_token(SCORES), "response_mask": _mask()})
    batch["uid"] = UID
    return batch


def _algorithm(**overrides):
    from omegaconf import OmegaConf

    node = schema_config().algorithm
    return OmegaConf.merge(node, overrides) if overrides else node


def _per_row(adv: torch.Tensor) -> list[float]:
    torch.testing.assert_close(adv, adv[:, :1] * _mask())  # one value per response
    return adv[:, 0].tolist()


def test_passk_credits_only_the_best_of_a_group():
    adv, returns = grpo_passk_advantage(_batch(), _algorithm())
    # group a: best 1 - second 0.5 = 0.5, over std([1, 0, 0.5]) = 0.5; group b ties: 0
    assert _per_row(adv) == pytest.approx([0.5 / (0.5 + 1e-6), 0, 0, 0, 0])
    torch.testing.assert_close(returns, adv)
    raw, _ = grpo_passk_advantage(_batch(), _algorithm(norm_adv_by_std_in_grpo=False))
    assert _per_row(raw) == pytest.approx([0.5, 0, 0, 0, 0])


def test_opo_baseline_weighs_scores_by_length():
    adv, _ = opo_advantage(_batch(), _algorithm())
    baseline = (2 * 1.0 + 3 * 0.0 + 1 * 0.5) / 6
    assert _per_row(adv) == pytest.approx([1 - baseline, -baseline, 0.5 - baseline, 0, 0])


def test_gpg_rescales_by_the_share_of_non_zero_scores():
    adv, _ = gpg_advantage(_batch(), _algorithm())
    alpha = 5 / 4  # four of the five scores are not 0
    assert _per_row(adv) == pytest.approx([alpha * 0.5, -alpha * 0.5, 0, 0, 0])


def _gdpo_reference(components, weights, by_std=True):
    """verl's GDPO written out: GRPO per dimension, weighted sum, whitened over tokens."""
    rows = range(len(UID))
    total = [0.0] * len(UID)
    for k, w in enumerate(weights):
        for i in rows:
            group = [components[j][k] for j in rows if UID[j] == UID[i]]
            mean = sum(group) / len(group)
            std = math.sqrt(sum((g - mean) ** 2 for g in group) / (len(group) - 1))
            centred = components[i][k] - mean
            total[i] += w * (centred / (std + 1e-6) if by_std else centred)
    tokens = [total[i] for i in rows for _ in range(LENGTHS[i])]
    mean = sum(tokens) / len(tokens)
    var = sum((x - mean) ** 2 for x in tokens) / (len(tokens) - 1)
    return [(total[i] - mean) / math.sqrt(var + 1e-8) for i in rows]


@pytest.mark.parametrize(("weights", "by_std"), [(None, True), ([2.0, 0.5], True), (None, False)])
def test_gdpo_normalises_each_dimension_then_whitens(weights, by_std):
    components = [[1.0, 0.0], [0.0, 3.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]]
    batch = _batch()
    batch["reward_components"] = torch.tensor(components)
    cfg = _algorithm(gdpo_reward_weights=weights, norm_adv_by_std_in_grpo=by_std)
    adv, returns = gdpo_advantage(batch, cfg)
    expected = _gdpo_reference(components, weights or [1.0, 1.0], by_std)
    assert _per_row(adv) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(returns, adv)


@pytest.mark.parametrize(
    "name", ["grpo_vectorized", "rloo_vectorized", "grpo_passk", "opo", "gpg", "gdpo"]
)
def test_selectable_by_verls_name(name):
    extra = ["algorithm.gdpo_reward_keys=[acc,fmt]"] if name == "gdpo" else []
    cfg = load_config(["recipe=tiny", f"algorithm.adv_estimator={name}", *extra])
    assert validate_config(cfg) == []


def test_gdpo_needs_its_reward_keys():
    problems = validate_config(load_config(["recipe=tiny", "algorithm.adv_estimator=gdpo"]))
    assert len(problems) == 1 and "algorithm.gdpo_reward_keys=None" in problems[0], problems
