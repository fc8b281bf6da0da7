"""The dapo algorithm's defaults, its step for each setting, and its config checks (one line
each, before Ray starts)."""

import pytest

from polyrl.api import build_pipeline
from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config

# recipe=dapo leaves DAPO's overlong punishment off (see the recipe); these turn it on
WITH_BUFFER = ("reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4")


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


def test_recipe_dapo_with_the_buffer_filters_around_the_overlong_penalty():
    step = build_pipeline(load_config(["recipe=dapo", *WITH_BUFFER]))
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
            ["reward_model.overlong_buffer.max_resp_len=17"],
            "reward_model.overlong_buffer.max_resp_len=17 must be from 1 to "
            "data.max_response_length (16)",
        ),
        (
            ["reward_model.overlong_buffer.max_resp_len=8", "reward_model.overlong_buffer.len=9"],
            "reward_model.overlong_buffer.len=9 must be from 1 to max_resp_len (8)",
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
    problems = validate_config(load_config(["recipe=dapo", *WITH_BUFFER, *overrides]))
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_recipe_dapo_is_valid():
    assert validate_config(load_config(["recipe=dapo"])) == []


@pytest.mark.parametrize(
    "override",
    [
        "algorithm.filter_groups.enable=true",
        "data.gen_batch_size=16",
    ],
)
def test_dapo_keys_with_another_algorithm_are_refused_not_ignored(override):
    problems = validate_config(load_config(["recipe=tiny", override]))
    key = override.split("=")[0]
    (line,) = [p for p in problems if p.startswith(key)]
    assert "read only by the algorithm 'dapo'" in line and "algorithm.name=dapo" in line


def test_an_interpolated_default_is_not_taken_for_a_change():
    assert validate_config(load_config(["recipe=tiny", "data.train_batch_size=16"])) == []


def test_verls_dapo_reward_manager_command_line_means_the_same_buffer():
    """verl's DAPO example: reward_manager=dapo with the buffer under reward_kwargs (``+`` on the
    keys verl does not declare) selects naive scoring and the overlong stage at its settings."""
    cfg = load_config(
        [
            "recipe=dapo",
            "reward_model.reward_manager=dapo",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.log=false",
            "+reward_model.reward_kwargs.max_resp_len=12",
        ]
    )
    buffer = cfg.reward_model.overlong_buffer
    assert (buffer.enable, buffer.len, buffer.penalty_factor, buffer.max_resp_len) == (
        True,
        4,
        0.5,
        12,
    )
    assert validate_config(cfg) == []


_ENABLED = ["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4"]


def test_the_grpo_family_applies_the_overlong_buffer_as_verls_dapo_reward_manager():
    overrides = ["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4"]
    for algorithm in ("grpo", "drgrpo", "rloo"):
        cfg = load_config(["recipe=tiny", f"algorithm.name={algorithm}", *overrides])
        assert validate_config(cfg) == []
        assert build_pipeline(cfg).names()[:3] == ["gen", "reward", "overlong_penalty"]
    bad = load_config(["recipe=tiny", "reward_model.overlong_buffer.enable=true"])
    (line,) = validate_config(bad)
    assert line.startswith("reward_model.overlong_buffer.len=0 must be from 1 to"), line


def test_an_algorithm_outside_the_family_refuses_the_overlong_buffer():
    cfg = load_config(["recipe=tiny", "algorithm.name=reinforce_plus_plus", *_ENABLED])
    lines = [p for p in validate_config(cfg) if p.startswith("reward_model.overlong_buffer")]
    algorithms = "'dapo', 'drgrpo', 'grpo', 'optimal_token_baseline', 'rloo'"
    assert lines and f"algorithms {algorithms}" in lines[0]
