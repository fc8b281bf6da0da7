"""The dapo algorithm's defaults, its step for each setting, and its config checks (one line
each, before Ray starts)."""

import pytest

from polyrl.api import build_pipeline
from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config


def test_dapo_brings_clip_higher_token_mean_and_dynamic_sampling():
    cfg = load_config(["recipe=tiny", "algorithm.name=dapo"])
    actor = cfg.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert actor.loss_agg_mode == "token-mean" and cfg.algorithm.adv_estimator == "grpo"
    assert cfg.algorithm.filter_groups.enable and cfg.data.gen_batch_size == 8
    explicit = load_config(
        ["recipe=tiny", "algorithm.name=dapo", "actor_rollout_ref.actor.clip_ratio_high=0.3"]
    )
    assert explicit.actor_rollout_ref.actor.clip_ratio_high == 0.3


@pytest.mark.parametrize(
    ("overrides", "stages"),
    [
        ([], ["dynamic_sampling", "old_log_prob"]),
        (["algorithm.filter_groups.enable=false"], ["gen", "reward", "old_log_prob"]),
        (
            ["algorithm.filter_groups.enable=false", "reward_model.overlong_buffer.enable=true"],
            ["gen", "reward", "overlong_penalty", "old_log_prob"],
        ),
    ],
)
def test_the_step_follows_the_settings(overrides, stages):
    cfg = load_config(
        ["recipe=tiny", "algorithm.name=dapo", "reward_model.overlong_buffer.len=4", *overrides]
    )
    assert build_pipeline(cfg).names()[: len(stages)] == stages


def test_recipe_dapo_filters_around_the_overlong_penalty():
    step = build_pipeline(load_config(["recipe=dapo"]))
    sampling = step["dynamic_sampling"]
    assert sampling.scoring.names() == ["reward", "overlong_penalty"]
    assert {"token_level_scores", "token_level_rewards", "uid"} <= set(sampling.provides)
    assert step.check() == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["data.gen_batch_size=5"],
            "data.gen_batch_size 5 is not divisible by the rollout's world size 2",
        ),
        (
            ["reward_model.overlong_buffer.len=17"],
            "reward_model.overlong_buffer.len=17 must be from 1 to data.max_response_length (16)",
        ),
        (
            ["reward_model.overlong_buffer.penalty_factor=-1"],
            "reward_model.overlong_buffer.penalty_factor=-1.0 must be >= 0",
        ),
        (["algorithm.filter_groups.metric=' '"], "algorithm.filter_groups.metric is empty"),
        (
            ["algorithm.filter_groups.enable=false", "data.gen_batch_size=16"],
            "data.gen_batch_size=16 differs from data.train_batch_size=8, but only dynamic "
            "sampling reads it",
        ),
    ],
)
def test_bad_settings_are_one_line_each(overrides, expected):
    problems = validate_config(load_config(["recipe=dapo", *overrides]))
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_recipe_dapo_is_valid():
    assert validate_config(load_config(["recipe=dapo"])) == []


@pytest.mark.parametrize(
    "override",
    [
        "algorithm.filter_groups.enable=true",
        "data.gen_batch_size=16",
        "reward_model.overlong_buffer.enable=true",
    ],
)
def test_dapo_keys_with_another_algorithm_are_refused_not_ignored(override):
    problems = validate_config(load_config(["recipe=tiny", override]))
    key = override.split("=")[0]
    (line,) = [p for p in problems if p.startswith(key)]
    assert "read only by the algorithm 'dapo'" in line and "algorithm.name=dapo" in line


def test_an_interpolated_default_is_not_taken_for_a_change():
    assert validate_config(load_config(["recipe=tiny", "data.train_batch_size=16"])) == []
