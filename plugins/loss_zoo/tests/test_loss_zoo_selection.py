"""Every loss of the package is selectable by verl's name on recipe=tiny, its keys sit at verl's
places with verl's defaults, and what cannot run is refused in one line before Ray starts."""

from __future__ import annotations

import pytest

from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config

LOSS_MODE = "actor_rollout_ref.actor.policy_loss.loss_mode"
SELECTABLE = ["gpg", "cispo", "dppo_tv", "dppo_kl", "sapo", "geo_mean", "clip_cov", "kl_cov"]


@pytest.mark.parametrize("name", [*SELECTABLE, "dro"])
def test_selectable_by_verls_name(name):
    extra = ["actor_rollout_ref.actor.policy_loss.dro_beta=0.1"] if name == "dro" else []
    assert validate_config(load_config(["recipe=tiny", f"{LOSS_MODE}={name}", *extra])) == []


def test_verls_keys_and_defaults():
    actor = load_config(["recipe=tiny"]).actor_rollout_ref.actor
    policy = actor.policy_loss
    assert (policy.clip_cov_ratio, policy.clip_cov_lb, policy.clip_cov_ub) == (0.0002, 1.0, 5.0)
    assert (policy.kl_cov_ratio, policy.ppo_kl_coef, policy.dro_beta) == (0.0002, 0.1, None)
    assert (actor.tau_pos, actor.tau_neg) == (1.0, 1.05)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["loss_mode=dro"], "policy_loss.dro_beta=None: loss_mode=dro needs a positive"),
        (["loss_mode=clip_cov", "clip_cov_ratio=0"], "clip_cov_ratio=0.0 must be > 0"),
        (["loss_mode=clip_cov", "clip_cov_lb=6"], "clip_cov_lb=6.0 must be below clip_cov_ub"),
        (["loss_mode=kl_cov", "kl_cov_ratio=-1"], "kl_cov_ratio=-1.0 must be > 0"),
        (["loss_mode=bypass_mode"], "verl's rollout correction in bypass mode"),
    ],
)
def test_bad_settings_are_one_line(overrides, expected):
    keys = [f"actor_rollout_ref.actor.policy_loss.{item}" for item in overrides]
    problems = validate_config(load_config(["recipe=tiny", *keys]))
    assert len(problems) == 1 and expected in problems[0], problems


def test_sapo_temperatures_must_be_positive():
    cfg = load_config(["recipe=tiny", f"{LOSS_MODE}=sapo", "actor_rollout_ref.actor.tau_neg=0"])
    assert validate_config(cfg) == [
        "actor_rollout_ref.actor.tau_neg=0.0 must be > 0 for loss_mode=sapo (verl's defaults: "
        "tau_pos=1.0, tau_neg=1.05)"
    ]
