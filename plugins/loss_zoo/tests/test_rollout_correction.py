"""verl's rollout correction against its formulas, worked out token by token in plain Python on
the hand-made batch of zoo_inputs, with OLD_P as the rollout's probabilities and NEW_P as the
current policy's: token ratios pi/pi_rollout 1.3, 0.5, 1.056 | 1.5, 0.833 | 6.0; advantages
+1.5, -0.8, +0.7. Then the ``bypass_mode`` loss built on it, and its selection by verl's keys."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict

import pytest
import torch
from omegaconf import OmegaConf
from zoo_inputs import ADV, LENGTHS, NEW_P, OLD_P, actor_node, batch_and_log_prob, tokens

from polyrl.api import Batch, ConfigError, agg_loss
from polyrl.api.testing import run_stage
from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config
from polyrl.plan import build_pipeline
from polyrl_loss_zoo.bypass import bypass_mode_policy_loss
from polyrl_loss_zoo.correction import rollout_correction
from polyrl_loss_zoo.correction_config import Correction, parse_correction, parse_criteria
from polyrl_loss_zoo.settings import RolloutCorrectionSettings

ROWS = range(len(LENGTHS))
RC = "algorithm.rollout_correction"


def ratio(i: int, t: int) -> float:
    return NEW_P[i][t] / OLD_P[i][t]


def log_ratio(i: int, t: int) -> float:
    return math.log(NEW_P[i][t]) - math.log(OLD_P[i][t])


def row_tokens(i: int) -> list[tuple[int, int]]:
    return [(i, t) for t in range(LENGTHS[i])]


def token_mean(value) -> float:
    return sum(value(i, t) for i, t in tokens()) / len(tokens())


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(current log-probs, rollout log-probs, response mask)."""
    batch, log_prob = batch_and_log_prob()
    return log_prob.detach(), batch["old_log_probs"], batch["response_mask"]


def correction(**settings) -> Correction:
    node = OmegaConf.create(
        {
            "rollout_is": None,
            "rollout_is_threshold": 2.0,
            "rollout_is_batch_normalize": False,
            "rollout_rs": None,
            "rollout_rs_threshold": None,
            "bypass_mode": True,
            "loss_type": "ppo_clip",
            **settings,
        }
    )
    return parse_correction(node)


def run(**settings):
    return rollout_correction(*inputs(), correction(**settings))


def approx(value: float):
    return pytest.approx(value, rel=1e-5, abs=1e-6)


# ---- importance weights ------------------------------------------------------------------------
def test_token_weights_are_ratios_truncated_at_the_threshold():
    weights, kept, metrics = run(rollout_is="token", rollout_is_threshold=2.0)
    for i, t in tokens():
        assert float(weights[i, t]) == approx(min(ratio(i, t), 2.0))
    assert float(weights[2, 1]) == 0.0  # padding
    torch.testing.assert_close(kept, inputs()[2])
    # verl measures the weights before truncation; spread and ESS of them clamped to [1/C, C]
    assert metrics["rollout_corr/rollout_is_mean"] == approx(token_mean(ratio))
    assert metrics["rollout_corr/rollout_is_max"] == approx(6.0)
    assert metrics["rollout_corr/rollout_is_min"] == approx(0.5)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == approx(1 / 6)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == 0.0  # 0.5 is not < 1/2
    clamped = [min(max(ratio(i, t), 0.5), 2.0) for i, t in tokens()]
    mean = sum(clamped) / 6
    assert metrics["rollout_corr/rollout_is_std"] == approx(
        math.sqrt(sum(c * c for c in clamped) / 6 - mean * mean)
    )
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == approx(
        1 / (sum((c / mean) ** 2 for c in clamped) / 6)
    )
    per_row = [sum(ratio(i, t) for i, t in row_tokens(i)) / LENGTHS[i] for i in ROWS]
    assert metrics["rollout_corr/rollout_is_seq_mean"] == approx(sum(per_row) / 3)
    assert metrics["rollout_corr/rollout_is_seq_std"] == approx(statistics.stdev(per_row))
    assert metrics["rollout_corr/rollout_is_seq_max_deviation"] == approx(5.0)
    assert metrics["rollout_corr/rollout_is_seq_fraction_high"] == approx(1 / 3)


def test_sequence_weights_are_the_truncated_product_and_batch_normalised():
    weights, _, metrics = run(
        rollout_is="sequence", rollout_is_threshold=2.0, rollout_is_batch_normalize=True
    )
    products = [math.prod(ratio(i, t) for i, t in row_tokens(i)) for i in ROWS]
    truncated = [min(p, 2.0) for p in products]
    factor = sum(truncated) / 3  # one weight per response, averaged over responses
    for i, t in tokens():
        assert float(weights[i, t]) == approx(truncated[i] / factor)
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == approx(factor)
    assert metrics["rollout_corr/rollout_is_max"] == approx(max(products))
    assert metrics["rollout_corr/rollout_is_min"] == approx(min(products))
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == approx(1 / 3)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == 0.0
    token_weighted = sum(products[i] * LENGTHS[i] for i in ROWS) / 6
    assert metrics["rollout_corr/rollout_is_mean"] == approx(token_weighted)


def test_token_batch_normalisation_divides_by_the_token_mean():
    weights, _, metrics = run(rollout_is="token", rollout_is_batch_normalize=True)
    factor = token_mean(lambda i, t: min(ratio(i, t), 2.0))
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == approx(factor)
    assert float(weights[2, 0]) == approx(2.0 / factor)


# ---- rejection ---------------------------------------------------------------------------------
def k1(i: int, t: int) -> float:
    return -log_ratio(i, t)


def k2(i: int, t: int) -> float:
    return 0.5 * log_ratio(i, t) ** 2


def k3(i: int, t: int) -> float:
    return ratio(i, t) - 1 - log_ratio(i, t)


def test_verls_multi_criteria_example_token_k1_and_seq_max_k2():
    """examples/rollout_correction/run_with_rollout_corr_multi_rs.sh: a token is kept when
    pi_rollout/pi lies in [0.6, 1.6] and its response's largest k2 is at most 2.5."""
    _, kept, metrics = run(rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.6_1.6,2.5")
    expected = torch.zeros(3, 3)
    for i, t in tokens():
        in_band = math.log(0.6) <= k1(i, t) <= math.log(1.6)
        seq_ok = max(k2(i, s) for _, s in row_tokens(i)) <= 2.5
        expected[i, t] = float(in_band and seq_ok)
    assert expected.tolist() == [[1, 0, 1], [1, 1, 0], [0, 0, 0]]
    torch.testing.assert_close(kept, expected)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == approx(2 / 6)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == approx(2 / 3)
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == approx(2 / 6)
    assert metrics["rollout_corr/rollout_rs_token_k1_seq_masked_fraction"] == approx(2 / 3)
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_masked_fraction"] == 0.0
    assert metrics["rollout_corr/rollout_rs_token_k1_mean"] == approx(token_mean(k1))
    # k1 of ratio 0.5 is above log 1.6, of ratio 6 below log 0.6
    assert metrics["rollout_corr/rollout_rs_token_k1_fraction_high"] == approx(1 / 6)
    assert metrics["rollout_corr/rollout_rs_token_k1_fraction_low"] == approx(1 / 6)
    peaks = [max(k2(i, t) for i, t in row_tokens(i)) for i in ROWS]
    # a sequence criterion's mean weighs each response's statistic by its tokens (verl's)
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_mean"] == approx(
        sum(peaks[i] * LENGTHS[i] for i in ROWS) / 6
    )
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_max"] == approx(max(peaks))
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_seq_std"] == approx(statistics.stdev(peaks))


@pytest.mark.parametrize(
    ("rs", "threshold", "keep_rows"),
    [
        # sum of k1 = -log prod r: rows 0.686, 1.25, 6 -> -log in [log 0.5, log 2]
        ("seq_sum_k1", "0.5_2.0", [True, True, False]),
        ("seq_sum_k1", 2.0, [True, True, False]),  # one bound: the lower is its reciprocal
        ("seq_mean_k3", 0.06, [False, True, False]),
        ("seq_sum_k2", 0.3, [True, True, False]),
        ("seq_max_k3", 0.15, [False, True, False]),
    ],
)
def test_sequence_criteria_keep_or_drop_whole_responses(rs, threshold, keep_rows):
    _, kept, _ = run(rollout_rs=rs, rollout_rs_threshold=threshold)
    for i, t in tokens():
        assert float(kept[i, t]) == float(keep_rows[i]), (i, t)


def test_the_sequence_statistics_behind_those_cases():
    sums_k2 = [sum(k2(i, t) for i, t in row_tokens(i)) for i in ROWS]
    means_k3 = [sum(k3(i, t) for i, t in row_tokens(i)) / LENGTHS[i] for i in ROWS]
    assert [s <= 0.3 for s in sums_k2] == [True, True, False]
    assert [m <= 0.06 for m in means_k3] == [False, True, False]
    peaks_k3 = [max(k3(i, t) for i, t in row_tokens(i)) for i in ROWS]
    assert [p <= 0.15 for p in peaks_k3] == [False, True, False]


def test_token_k2_and_k3_reject_single_tokens():
    _, kept, _ = run(rollout_rs="token_k2,token_k3", rollout_rs_threshold="0.1,0.1")
    for i, t in tokens():
        assert float(kept[i, t]) == float(k2(i, t) <= 0.1 and k3(i, t) <= 0.1)


@pytest.mark.parametrize(
    ("rs", "threshold", "message"),
    [
        ("token_k4", 1.0, "unknown criterion ['token_k4']"),
        ("token_k1", None, "needs algorithm.rollout_correction.rollout_rs_threshold"),
        ("token_k1,seq_max_k2", "1.5,2,3", "3 entries for 2 criteria"),
        ("seq_max_k2", "0.5_2", "takes one upper bound"),
        ("token_k1", "0_2", "must be positive"),
        ("token_k2", "-1", "must be positive"),
        ("token_k2", "high", "not a number"),
    ],
)
def test_bad_rejection_specs_are_one_line(rs, threshold, message):
    with pytest.raises(ConfigError, match=None) as caught:
        parse_criteria(rs, threshold)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_duplicate_criteria_count_once_and_share_a_threshold():
    criteria = parse_criteria("token_k1, token_k1,seq_mean_k1", "2.0")
    assert [c.name for c in criteria] == ["token_k1", "seq_mean_k1"]
    assert criteria[0].lower == approx(math.log(0.5))
    assert criteria[0].upper == approx(math.log(2.0))


# ---- the gap's diagnostics ---------------------------------------------------------------------
def test_offpolicy_metrics_are_verls():
    _, _, metrics = run()
    assert metrics["rollout_corr/kl"] == approx(token_mean(k1))
    assert metrics["rollout_corr/k3_kl"] == approx(token_mean(k3))
    assert metrics["rollout_corr/chi2_token"] == approx(
        token_mean(lambda i, t: ratio(i, t) ** 2) - 1
    )
    products = [math.prod(ratio(i, t) for i, t in row_tokens(i)) for i in ROWS]
    assert metrics["rollout_corr/chi2_seq"] == approx(sum(p * p for p in products) / 3 - 1)
    trained = [sum(math.log(NEW_P[i][t]) for i, t in row_tokens(i)) / LENGTHS[i] for i in ROWS]
    sampled = [sum(math.log(OLD_P[i][t]) for i, t in row_tokens(i)) / LENGTHS[i] for i in ROWS]
    assert metrics["rollout_corr/training_ppl"] == approx(sum(math.exp(-m) for m in trained) / 3)
    assert metrics["rollout_corr/rollout_log_ppl"] == approx(-sum(sampled) / 3)
    diffs = [s - m for s, m in zip(sampled, trained, strict=True)]
    assert metrics["rollout_corr/log_ppl_diff"] == approx(sum(diffs) / 3)
    assert metrics["rollout_corr/log_ppl_diff_max"] == approx(max(diffs))
    assert metrics["rollout_corr/ppl_ratio"] == approx(sum(math.exp(d) for d in diffs) / 3)


# ---- the bypass_mode loss ----------------------------------------------------------------------
def bypass_batch() -> tuple[Batch, torch.Tensor]:
    """zoo_inputs' batch with its old log-probs as the rollout's (bypass: no recomputation)."""
    batch, log_prob = batch_and_log_prob()
    batch["rollout_log_probs"] = batch["old_log_probs"]
    return batch, log_prob


def bypass_node(**settings):
    rc = {**asdict(RolloutCorrectionSettings()), "bypass_mode": True, **settings}
    return actor_node(policy_loss={"rollout_correction": rc})


def test_reinforce_is_minus_weight_advantage_log_prob_on_kept_tokens():
    batch, log_prob = bypass_batch()
    node = bypass_node(
        loss_type="reinforce",
        rollout_is="token",
        rollout_rs="token_k1",
        rollout_rs_threshold="0.6_1.6",
    )
    loss, metrics = bypass_mode_policy_loss(batch, log_prob, node)
    for i, t in tokens():
        kept = math.log(0.6) <= k1(i, t) <= math.log(1.6)
        expected = -min(ratio(i, t), 2.0) * ADV[i] * math.log(NEW_P[i][t]) if kept else 0.0
        assert float(loss[i, t].detach()) == approx(expected), (i, t)
    kept_tokens = [(0, 0), (0, 2), (1, 0), (1, 1)]
    assert float(metrics["ppo_kl"]) == approx(sum(k1(i, t) for i, t in kept_tokens) / 4)
    assert "rollout_corr/rollout_rs_masked_fraction" in metrics
    loss.sum().backward()  # the weight is a constant: d/dlogp = -w * A
    assert float(log_prob.grad[1, 0]) == approx(-1.5 * -0.8)


def test_ppo_clip_is_vanillas_surrogate_against_the_rollout_and_logs_the_weights():
    batch, log_prob = bypass_batch()
    node = bypass_node(rollout_is="token")
    loss, metrics = bypass_mode_policy_loss(batch, log_prob, node)
    for i, t in tokens():
        r, a = ratio(i, t), ADV[i]
        ppo = max(-a * r, -a * min(max(r, 0.8), 1.2))
        expected = min(ppo, -a * 3.0) if a < 0 else ppo
        assert float(loss[i, t].detach()) == approx(expected), (i, t)
    assert float(metrics["ppo_kl"]) == approx(token_mean(k1))
    assert metrics["rollout_corr/rollout_is_mean"] == approx(token_mean(ratio))


def test_seq_mean_token_mean_averages_each_response_over_its_kept_tokens():
    batch, log_prob = bypass_batch()
    node = bypass_node(loss_type="reinforce", rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6")
    node.loss_agg_mode = "seq-mean-token-mean"
    loss, _ = bypass_mode_policy_loss(batch, log_prob, node)
    got = agg_loss(loss, batch["response_mask"], "seq-mean-token-mean")
    kept = {0: [0, 2], 1: [0, 1], 2: []}
    per_row = [
        sum(-ADV[i] * math.log(NEW_P[i][t]) for t in kept[i]) / len(kept[i]) if kept[i] else 0.0
        for i in ROWS
    ]
    # verl: the response with no kept token counts as 0
    assert float(got.detach()) == approx(sum(per_row) / 3)


# ---- selection by verl's keys ------------------------------------------------------------------
MULTI_RS = [
    f"{RC}.rollout_is=token",
    f"{RC}.rollout_rs='token_k1,seq_max_k2'",
    f"{RC}.rollout_rs_threshold='0.6_1.6,2.5'",
    f"{RC}.bypass_mode=true",
]


def test_verls_keys_select_the_bypass_loss_and_reach_it():
    cfg = load_config(["recipe=tiny", *MULTI_RS])
    assert validate_config(cfg) == []
    policy = cfg.actor_rollout_ref.actor.policy_loss
    assert policy.loss_mode == "bypass_mode"
    assert policy.rollout_correction.rollout_rs == "token_k1,seq_max_k2"
    parsed = parse_correction(policy.rollout_correction)
    assert [c.name for c in parsed.criteria] == ["token_k1", "seq_max_k2"]


def test_verls_defaults_select_nothing():
    cfg = load_config(["recipe=tiny"])
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    assert dict(cfg.algorithm.rollout_correction) == {
        "rollout_is": None,
        "rollout_is_threshold": 2.0,
        "rollout_is_batch_normalize": False,
        "rollout_rs": None,
        "rollout_rs_threshold": None,
        "bypass_mode": False,
        "loss_type": "ppo_clip",
    }


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            [f"{RC}.rollout_is=token", "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"],
            "is verl's rollout correction in bypass mode: set algorithm.rollout_correction.bypass",
        ),
        (
            [f"{RC}.rollout_is=token", "actor_rollout_ref.actor.tis_imp_ratio_cap=2"],
            "rollout_is=token corrects for the rollout's policy already",
        ),
        (
            [f"{RC}.rollout_is=sequence", "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean"],
            "the policy loss actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean is sequence",
        ),
        ([f"{RC}.rollout_rs=seq_max_k1", f"{RC}.rollout_rs_threshold=2"], "seq_max_k1"),
        ([f"{RC}.bypass_mode=true", f"{RC}.rollout_is=tokens"], "rollout_is='tokens'"),
        ([f"{RC}.bypass_mode=true", f"{RC}.loss_type=gpg"], "use ppo_clip or reinforce"),
        (
            [f"{RC}.bypass_mode=true", "actor_rollout_ref.actor.tis_imp_ratio_cap=2"],
            "would correct a second time",
        ),
        (
            [f"{RC}.bypass_mode=true", f"{RC}.rollout_rs=seq_max_k2"],
            "needs algorithm.rollout_correction.rollout_rs_threshold",
        ),
    ],
)
def test_what_polyrl_cannot_run_is_one_line(overrides, expected):
    problems = validate_config(load_config(["recipe=tiny", *overrides]))
    assert len(problems) == 1 and expected in problems[0], problems


def test_another_loss_mode_conflicts_with_bypass():
    with pytest.raises(ConfigError, match=r"loss_mode=gspo conflicts with .*bypass_mode=true"):
        load_config(
            [
                "recipe=tiny",
                f"{RC}.bypass_mode=true",
                "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            ]
        )


# ---- decoupled mode: a stage before adv, weights on the selected loss --------------------------
DECOUPLED = [
    f"{RC}.rollout_is=sequence",
    f"{RC}.rollout_is_batch_normalize=true",
    f"{RC}.rollout_rs=token_k1",
    f"{RC}.rollout_rs_threshold='0.6_1.6'",
]


def test_decoupled_mode_adds_a_stage_before_adv_and_keeps_the_loss():
    cfg = load_config(["recipe=grpo", *DECOUPLED])
    assert validate_config(cfg) == []
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    step = build_pipeline(cfg)
    names = step.names()
    assert names.index("old_log_prob") < names.index("rollout_correction") < names.index("adv")
    assert "rollout_is_weights" in step["update_actor"].requires


def test_without_settings_the_step_is_verls_standard_one():
    assert "rollout_correction" not in build_pipeline(load_config(["recipe=grpo"])).names()


def test_the_stage_weighs_the_old_policy_against_the_rollout_over_the_whole_batch():
    batch, _ = batch_and_log_prob()
    batch["rollout_log_probs"] = batch["old_log_probs"]
    batch["old_log_probs"] = batch_and_log_prob()[1].detach()  # NEW_P as the recomputed policy
    stage = build_pipeline(load_config(["recipe=grpo", *DECOUPLED]))["rollout_correction"]
    state = run_stage(stage, batch)
    products = [math.prod(ratio(i, t) for i, t in row_tokens(i)) for i in ROWS]
    kept = torch.zeros(3, 3)  # token_k1 0.6_1.6: ratios 0.5 and 6 fall out
    for i, t in tokens():
        kept[i, t] = float(math.log(0.6) <= k1(i, t) <= math.log(1.6))
    torch.testing.assert_close(state.batch["response_mask"], kept)
    # normalised by the mean over responses of the truncated weights, before rejection
    truncated = [min(p, 2.0) for p in products]
    factor = sum(truncated) / 3
    weights = state.batch["rollout_is_weights"]
    for i, t in tokens():
        assert float(weights[i, t]) == approx(truncated[i] / factor)
    assert state.metrics["rollout_corr/rollout_is_batch_norm_factor"] == approx(factor)
    assert state.metrics["rollout_corr/rollout_rs_masked_fraction"] == approx(2 / 6)
