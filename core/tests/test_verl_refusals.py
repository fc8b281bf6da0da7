"""verl features met by verl's example scripts that polyrl maps, notes or refuses in one line:
the reward loop's engine keys (``reward_model.rollout.*``) by what the rest of the command line
asks for (a discriminative reward model, a generative one called from the custom reward
function, or polyrl's judge), the TensorRT-LLM rollout, groups of one sample, and verl's FSDP
mixed-precision dtypes (the FSDP engine's keys)."""

from __future__ import annotations

from pathlib import Path

from polyrl.config import load_config
from polyrl.config.keys import check_override_keys
from polyrl.config.validate import validate_config, verl_lines
from polyrl.config.verl_compat import NOT_SUPPORTED, judge_settings_from_verl

LOOP = [
    "reward_model.use_reward_loop=True",
    "reward_model.rollout.name=vllm",
    "reward_model.rollout.gpu_memory_utilization=0.8",
    "reward_model.rollout.tensor_model_parallel_size=1",
    "reward_model.rollout.prompt_length=1024",
    "reward_model.rollout.response_length=256",
]
RM = ["reward_model.enable=True", "reward_model.model.path=builtin:tiny"]
FUNCTION = str(Path(__file__).parent / "fixtures" / "verl_reward.py")


def lines(*overrides: str) -> tuple[list[str], list[str]]:
    return verl_lines(load_config(["recipe=tiny", *overrides]))


def test_a_discriminative_reward_model_on_the_reward_loop_is_noted_once() -> None:
    """verl's reward loop without a custom function scores with the model itself (DisRM):
    polyrl's reward_model role runs it; the engine keys are one notice, no problem."""
    problems, notices = lines(*RM, *LOOP)
    assert problems == []
    loop = [n for n in notices if n.startswith("reward_model.rollout.")]
    assert len(loop) == 1
    assert "name=vllm" in loop[0] and "gpu_memory_utilization=0.8" in loop[0]
    assert "reward_model role" in loop[0] and "policy's tokenizer" in loop[0]
    # the whole config validates (PPO has the reward_model role)
    cfg = load_config(["recipe=ppo", *RM, *LOOP])
    assert not [p for p in validate_config(cfg) if "reward_model.rollout" in p]


def test_the_engine_keys_without_a_reward_model_are_noted() -> None:
    problems, notices = lines(*LOOP)
    assert problems == []
    assert any("reward_model.enable is false" in n for n in notices)


def test_a_generative_reward_model_is_one_refusal_naming_the_judge_keys() -> None:
    """A model served to custom_reward_function (verl's GenRM): one line, with the judge keys
    that stand for the command line (the mapping of polyrl-reward-judge's README)."""
    problems, _ = lines(*RM, *LOOP, f"custom_reward_function.path={FUNCTION}")
    assert len(problems) == 1
    line = problems[0]
    assert NOT_SUPPORTED in line and "generative reward model" in line
    for part in (
        "reward_model.reward_manager=judge",
        "reward_model.judge.model_path=builtin:tiny",
        "reward_model.judge.rollout=vllm",
        "reward_model.judge.max_prompt_tokens=1024",
        "reward_model.judge.max_new_tokens=256",
        "reward_model.judge.template",
    ):
        assert part in line, part


def test_the_mapping_of_verls_keys_onto_the_judge() -> None:
    cfg = load_config(["recipe=tiny", *RM, *LOOP, "reward_model.rollout.dtype=float16"])
    changed = [
        ("reward_model.rollout.name", "sglang"),
        ("reward_model.rollout.dtype", "float16"),
        ("reward_model.rollout.prompt_length", 1024),
        ("reward_model.rollout.response_length", 64),
        ("reward_model.rollout.gpu_memory_utilization", 0.8),
    ]
    assert judge_settings_from_verl(cfg, changed) == {
        "reward_model.reward_manager": "judge",
        "reward_model.judge.model_path": "builtin:tiny",
        "reward_model.judge.rollout": "sglang",
        "reward_model.judge.dtype": "float16",
        "reward_model.judge.max_prompt_tokens": 1024,
        "reward_model.judge.max_new_tokens": 64,
    }


def test_with_the_judge_a_key_is_refused_until_its_judge_key_holds_the_value() -> None:
    judge = ["reward_model.reward_manager=judge", "reward_model.judge.model_path=builtin:tiny"]
    problems, notices = lines(*judge, *LOOP)
    assert sorted(p.split("=", 1)[0] for p in problems) == [
        "reward_model.rollout.name",
        "reward_model.rollout.prompt_length",
        "reward_model.rollout.response_length",
    ]
    assert all(NOT_SUPPORTED in p for p in problems)
    assert any(p.endswith("use reward_model.judge.max_new_tokens=256") for p in problems)
    assert any("gpu_memory_utilization=0.8" in n and "defaults" in n for n in notices)
    problems, notices = lines(
        *judge,
        *LOOP,
        "reward_model.judge.rollout=vllm",
        "reward_model.judge.max_prompt_tokens=1024",
        "reward_model.judge.max_new_tokens=256",
    )
    assert problems == []
    assert any("reward_model.judge.max_new_tokens sets it" in n for n in notices)


def test_tensorrt_llm_rollout_is_a_verl_feature_refusal_naming_the_engines() -> None:
    cfg = load_config(["recipe=tiny", "actor_rollout_ref.rollout.name=trtllm"])
    found = [p for p in validate_config(cfg) if "trtllm" in p]
    assert len(found) == 1
    assert NOT_SUPPORTED in found[0] and "TensorRT-LLM" in found[0]
    assert "unknown" not in found[0] and "hf" in found[0]
    # another unknown name is still "unknown", with the closest name
    cfg = load_config(["recipe=tiny", "actor_rollout_ref.rollout.name=vlm"])
    assert any("unknown rollout_engine 'vlm'" in p for p in validate_config(cfg))


def test_grpo_takes_groups_of_one_as_verl_with_a_notice(caplog) -> None:
    """GRPO with rollout.n=1: verl's raw-score advantage (mean 0, std 1 for a group of one),
    said once; an estimator that defines no group of one (RLOO) still refuses n=1."""
    import logging

    cfg = load_config(
        ["recipe=tiny", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"]
    )
    with caplog.at_level(logging.WARNING):
        assert not [p for p in validate_config(cfg) if "group" in p]
    noticed = [r.getMessage() for r in caplog.records if "group of one" in r.getMessage()]
    assert len(noticed) == 1
    assert noticed[0].startswith(
        "algorithm.adv_estimator='grpo' with actor_rollout_ref.rollout.n=1: each prompt is a "
        "group of one, which has no baseline: its advantage is its raw score"
    )
    rloo = load_config(
        ["recipe=tiny", "algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1"]
    )
    found = [p for p in validate_config(rloo) if "groups of one" in p]
    assert len(found) == 1 and NOT_SUPPORTED in found[0]


def test_verls_fsdp_mixed_precision_dtypes_are_the_fsdp_engines_keys() -> None:
    """verl's ``+fsdp_config.mixed_precision.<dtype>`` means the FSDP engine's
    ``fsdp_config.<dtype>`` (its ``mixed_precision`` is a switch)."""
    overrides = ["+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bf16"]
    check_override_keys(overrides)
    assert overrides == ["++actor_rollout_ref.actor.fsdp_config.reduce_dtype=bf16"]


VAL = "actor_rollout_ref.rollout.val_kwargs"


def test_validation_samples_at_its_temperature_whatever_do_sample_says() -> None:
    """verl's rollout ignores val_kwargs.do_sample and samples at val_kwargs.temperature (greedy
    at 0); so does polyrl, with one line when do_sample=false says otherwise. Several samples
    validate (verl's multi-turn DAPO script asks for 16); several at temperature 0 are a
    problem (identical greedy answers)."""
    for n in (1, 16):
        problems, notices = lines(f"{VAL}.temperature=1.0", f"{VAL}.n={n}")
        assert problems == []
        found = [line for line in notices if "do_sample=false is not read" in line]
        assert len(found) == 1 and "samples at temperature 1.0" in found[0], notices
    _, notices = lines(f"{VAL}.temperature=1.0", f"{VAL}.do_sample=true")
    assert not any("do_sample" in n for n in notices)
    cfg = load_config(["recipe=tiny", f"{VAL}.temperature=1.0", f"{VAL}.n=4"])
    assert validate_config(cfg) == []
    cfg = load_config(["recipe=tiny", f"{VAL}.n=4"])
    found = [p for p in validate_config(cfg) if "identical greedy answers" in p]
    assert len(found) == 1 and "temperature > 0" in found[0]


def test_the_validation_sampling_follows_the_temperature() -> None:
    """The sampling settings validation hands the rollout: greedy exactly at temperature 0."""
    from polyrl.trainer.trainer import validation_sampling_params

    for temperature, do_sample, greedy in (
        (0.0, False, True),
        (0.6, False, False),
        (0.6, True, False),
    ):
        cfg = load_config(
            ["recipe=tiny", f"{VAL}.temperature={temperature}", f"{VAL}.do_sample={do_sample}"]
        )
        params = validation_sampling_params(cfg)
        assert params.greedy is greedy
        if not greedy:
            assert params.temperature == temperature


def test_the_prefix_grouper_is_accepted_as_a_notice() -> None:
    """verl's shared-prefix forward changes no log-prob or gradient: one line, no problem."""
    problems, notices = lines("actor_rollout_ref.actor.use_prefix_grouper=true")
    assert problems == []
    found = [n for n in notices if n.startswith("actor_rollout_ref.actor.use_prefix_grouper")]
    assert len(found) == 1 and "results are the same" in found[0], notices


def test_sum_pi_squared_is_polyrls_key_not_a_refusal() -> None:
    problems, notices = lines("actor_rollout_ref.actor.calculate_sum_pi_squared=true")
    assert problems == [] and not [n for n in notices if "sum_pi_squared" in n]
    problems, notices = lines("actor_rollout_ref.actor.sum_pi_squared_checkpointing=true")
    assert problems == [] and any("nothing is kept for a backward" in n for n in notices)
