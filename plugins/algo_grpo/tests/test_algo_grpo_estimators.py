"""GRPO, Dr.GRPO and RLOO advantages against values worked out by hand."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from polyrl.batch import Batch
from polyrl.testing.configs import algorithm_config
from polyrl_algo_grpo.advantages import drgrpo_advantage, grpo_advantage, rloo_advantage

torch.set_num_threads(1)

# Four groups, interleaved on purpose (rows of a group need not be contiguous):
#   "a": scores [1, 0, 0, 1]   "b": scores [2, 0, 1]   "c": a singleton [5]   "d": [1, 1]
INDEX = np.array(["a", "b", "a", "c", "b", "a", "d", "b", "a", "d"], dtype=object)
SCORES = [1.0, 2.0, 0.0, 5.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
LENGTHS = [3, 1, 2, 3, 2, 1, 3, 3, 2, 1]
WIDTH = 3


def _batch(rewards, mask, uid):
    batch = Batch({"token_level_rewards": rewards, "response_mask": mask})
    batch["uid"] = uid  # no row check here, so a test can hand in a wrong number of ids
    return batch


def _fixture():
    """The outcome reward sits on each response's last token; padding holds junk (7.0)."""
    rewards = torch.full((len(SCORES), WIDTH), 7.0)
    mask = torch.zeros(len(SCORES), WIDTH)
    for row, (score, length) in enumerate(zip(SCORES, LENGTHS)):
        mask[row, :length] = 1
        rewards[row, :length] = 0.0
        rewards[row, length - 1] = score
    return rewards, mask


def _per_row(adv, mask):
    """The advantage of each row (the same on its tokens), checking it is constant and masked."""
    assert torch.all(adv[mask == 0] == 0), "advantages must be zero on padding"
    firsts = adv[:, 0]
    torch.testing.assert_close(adv, firsts.unsqueeze(-1) * mask)
    return firsts.tolist()


def _run(fn, config):
    rewards, mask = _fixture()
    adv, returns = fn(_batch(rewards, mask, INDEX), config)
    torch.testing.assert_close(adv, returns)
    assert adv.shape == rewards.shape and adv.dtype == rewards.dtype
    return _per_row(adv, mask)


def test_grpo_normalised_by_group_std():
    # "a": mean 0.5; unbiased var = (4 * 0.25) / 3 = 1/3, std 0.5773503
    #      -> +-0.5 / (0.5773503 + 1e-6) = +-0.8660239
    # "b": mean 1; var = (1 + 1 + 0) / 2 = 1, std 1 -> [1, -1, 0] / (1 + 1e-6)
    # "c": singleton: mean 0, std 1 as in verl -> 5 / (1 + 1e-6)
    # "d": equal scores, std 0 -> 0 / 1e-6 = 0
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert a == pytest.approx(0.8660239, rel=1e-6)
    b = 1 / (1 + 1e-6)
    expected = [a, b, -a, 5 * b, -b, -a, 0.0, 0.0, a, 0.0]
    got = _run(grpo_advantage, algorithm_config(norm_adv_by_std_in_grpo=True))
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_grpo_default_config_normalises_by_std():
    got = _run(grpo_advantage, algorithm_config())
    assert got[0] == pytest.approx(0.8660239, rel=1e-6)


def test_grpo_without_std():
    cfg = algorithm_config(norm_adv_by_std_in_grpo=False)
    # score - group mean: "a" +-0.5, "b" [1, -1, 0], the singleton "c" its raw score 5
    expected = [0.5, 1.0, -0.5, 5.0, -1.0, -0.5, 0.0, 0.0, 0.5, 0.0]
    assert _run(grpo_advantage, cfg) == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize("by_std", [True, False])
def test_grpo_with_groups_of_one_gives_the_raw_score_as_verl(by_std):
    """rollout.n=1: every prompt is its own group; verl's compute_grpo_outcome_advantage takes
    mean 0 and std 1 there, so the advantage is the score (over 1 + 1e-6 with the std)."""
    scores = torch.tensor([1.0, 0.0, -0.5, 2.0])
    rewards = torch.zeros(4, 3)
    rewards[:, 1] = scores
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.float32)
    cfg = algorithm_config(norm_adv_by_std_in_grpo=by_std)
    adv, returns = grpo_advantage(_batch(rewards, mask, np.array(["p", "q", "r", "s"])), cfg)
    expected = scores / (1 + 1e-6) if by_std else scores
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)
    torch.testing.assert_close(returns, adv)
    # the other estimators keep a group of one neutral (and need n >= 2)
    for fn in (drgrpo_advantage, rloo_advantage):
        other, _ = fn(_batch(rewards, mask, np.array(["p", "q", "r", "s"])), cfg)
        assert torch.all(other == 0)


def test_drgrpo_never_divides_by_std():
    # the config knob is ignored: Dr.GRPO is defined without the std
    expected = [0.5, 1.0, -0.5, 0.0, -1.0, -0.5, 0.0, 0.0, 0.5, 0.0]
    got = _run(drgrpo_advantage, algorithm_config(norm_adv_by_std_in_grpo=True))
    assert got == pytest.approx(expected, abs=1e-7)


def test_rloo_leave_one_out():
    # "a" [1,0,0,1]: 1 - (0+0+1)/3 = 2/3 ; 0 - (1+0+1)/3 = -2/3
    # "b" [2,0,1]:   2 - (0+1)/2 = 1.5 ; 0 - (2+1)/2 = -1.5 ; 1 - (2+0)/2 = 0
    # (= n/(n-1) * (s - mean): 4/3 * 0.5 = 2/3, 3/2 * 1 = 1.5)
    t = 2 / 3
    expected = [t, 1.5, -t, 0.0, -1.5, -t, 0.0, 0.0, t, 0.0]
    assert _run(rloo_advantage, algorithm_config()) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("fn", [grpo_advantage, drgrpo_advantage, rloo_advantage])
def test_better_response_gets_positive_advantage(fn):
    # reward spread over tokens: row sums are 1.0 (0.5 + 0.5) and 0.0
    rewards = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, _ = fn(_batch(rewards, mask, np.array([0, 0])), algorithm_config())
    assert torch.all(adv[0] > 0) and torch.all(adv[1, :2] < 0) and adv[1, 2] == 0
    assert adv.requires_grad is False


def test_uid_may_be_ints_or_a_tensor():
    rewards, mask = _fixture()
    expected = _run(grpo_advantage, algorithm_config())
    codes = {"a": 0, "b": 1, "c": 2, "d": 3}
    as_ints = np.array([codes[i] for i in INDEX])
    for uid in (as_ints, torch.as_tensor(as_ints), list(as_ints)):
        adv, _ = grpo_advantage(_batch(rewards, mask, uid), algorithm_config())
        assert adv[:, 0].tolist() == pytest.approx(expected, abs=1e-7)


def test_uid_must_match_rows():
    rewards, mask = _fixture()
    with pytest.raises(ValueError, match="one id per response"):
        grpo_advantage(_batch(rewards, mask, INDEX[:3]), algorithm_config())


def test_shape_mismatch_is_a_clear_error():
    rewards, mask = _fixture()
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        rloo_advantage(_batch(rewards, mask[:, :2], INDEX), algorithm_config())


def test_entry_point_module_is_light():
    code = (
        "import sys, polyrl_algo_grpo.plugin as p; "
        "specs = list(p.polyrl_advantage_estimators()) + list(p.polyrl_policy_losses()); "
        "assert 'torch' not in sys.modules, 'plugin.py imported torch'; print(len(specs))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "13"


def test_registered_through_the_entry_point(monkeypatch):
    from polyrl.registry import discover
    from polyrl.specs import PluginKind

    monkeypatch.setenv("POLYRL_PLUGINS", "polyrl-algo-grpo")
    registry = discover()
    for name, fn in (
        ("grpo", grpo_advantage),
        ("drgrpo", drgrpo_advantage),
        ("dr_grpo", drgrpo_advantage),
        ("rloo", rloo_advantage),
    ):
        reg = registry.get(PluginKind.ADVANTAGE_ESTIMATOR, name)
        assert reg.provenance.distribution == "polyrl-algo-grpo"
        assert reg.spec.requires_groups
        assert set(reg.spec.requires) == {"token_level_rewards", "response_mask", "uid"}
        assert reg.load() is fn
    drgrpo = registry.get(PluginKind.ALGORITHM, "drgrpo").spec.config_defaults
    assert drgrpo["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-sum-norm"
    grpo = registry.get(PluginKind.ALGORITHM, "grpo").spec.config_defaults
    assert "actor_rollout_ref.actor.loss_agg_mode" not in grpo
    assert registry.get(PluginKind.POLICY_LOSS, "gspo").load().__name__ == "gspo_policy_loss"


def test_drgrpo_brings_its_loss_aggregation_and_the_command_line_wins():
    from polyrl.config.loader import load_config

    def mode(*overrides):
        return load_config(list(overrides)).actor_rollout_ref.actor.loss_agg_mode

    assert mode("algorithm.adv_estimator=drgrpo") == "seq-mean-token-sum-norm"
    assert mode("algorithm.adv_estimator=grpo") == "token-mean"
    explicit = "actor_rollout_ref.actor.loss_agg_mode=token-mean"
    assert mode("algorithm.adv_estimator=drgrpo", explicit) == "token-mean"


@pytest.mark.parametrize("seed", range(4))
def test_random_groups_match_a_statistics_module_reference(seed):
    """Element-by-element reference with Python's statistics module (stdev is unbiased)."""
    import random
    import statistics

    rnd = random.Random(seed)
    sizes = [rnd.randint(1, 6) for _ in range(5)]
    ids = [g for g, n in enumerate(sizes) for _ in range(n)]
    rnd.shuffle(ids)
    scores = [float(rnd.choice([0, 0.5, 1, 2])) + rnd.gauss(0, 0.1) for _ in ids]
    rewards = torch.zeros(len(ids), 2)
    rewards[:, 1] = torch.tensor(scores)
    mask = torch.ones(len(ids), 2)
    batch = _batch(rewards, mask, np.array(ids))
    grpo, _ = grpo_advantage(batch, algorithm_config())
    rloo, _ = rloo_advantage(batch, algorithm_config())
    for row, (g, s) in enumerate(zip(ids, scores)):
        group = [scores[k] for k, h in enumerate(ids) if h == g]
        if len(group) == 1:  # GRPO as verl: mean 0, std 1; RLOO: no others, 0
            expected_grpo, expected_rloo = s / (1 + 1e-6), 0.0
        else:
            mean = statistics.fmean(group)
            expected_grpo = (s - mean) / (statistics.stdev(group) + 1e-6)
            expected_rloo = s - (sum(group) - s) / (len(group) - 1)
        assert grpo[row, 1].item() == pytest.approx(expected_grpo, rel=1e-5, abs=1e-5)
        assert rloo[row, 1].item() == pytest.approx(expected_rloo, rel=1e-5, abs=1e-6)
