"""``polyrl validate`` on PPO configs: one line per problem, before any device is taken."""

from __future__ import annotations

import pytest

from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config
from polyrl.specs import TrainingEngineSpec


def problems(*overrides: str) -> list[str]:
    return validate_config(load_config(["recipe=ppo", *overrides]))


def one_problem(*overrides: str) -> str:
    found = problems(*overrides)
    assert len(found) == 1, found
    return found[0]


def test_the_recipe_is_valid():
    assert problems() == []


def test_verl_command_line_keys_parse_and_are_honoured():
    cfg = load_config(
        [
            "recipe=ppo",
            "critic.model.use_remove_padding=True",
            "critic.model.enable_gradient_checkpointing=True",
            "critic.model.fsdp_config.param_offload=False",
            "critic.optim.lr=1e-5",
            "critic.ppo_micro_batch_size_per_gpu=4",
            "critic.grad_clip=0.5",
            "trainer.critic_warmup=0",
        ]
    )
    assert validate_config(cfg) == []
    assert cfg.critic.optim.clip_grad == 0.5  # verl's critic.grad_clip is the clip
    assert cfg.critic.forward_micro_batch_size_per_gpu == 4  # follows the training micro-batch


def test_an_engine_without_a_value_head_is_refused(register_plugin):
    register_plugin(
        TrainingEngineSpec(
            name="novalue",
            description="an engine without a value head",
            engine="polyrl_engine_fsdp.engine:FSDPEngine",
            supports_cpu=True,
        )
    )
    line = one_problem("critic.strategy=novalue")
    assert line.startswith("critic.strategy='novalue' (package test-plugin) has no value head")
    assert "engines that can: fsdp, fsdp2" in line


def test_an_unknown_critic_engine_is_one_line():
    line = one_problem("critic.strategy=fsdp3")
    assert line == (
        "critic.strategy='fsdp3' is not an installed training engine; engines with a value "
        "head: fsdp, fsdp2, megatron"
    )


def test_critic_enable_false_contradicts_gae():
    line = one_problem("critic.enable=false")
    assert line.startswith("critic.enable=false, but algorithm 'ppo' trains a critic")


def test_ppo_with_an_estimator_that_ignores_the_values_is_refused():
    line = one_problem("algorithm.name=ppo", "algorithm.adv_estimator=grpo")
    assert "algorithm.adv_estimator='grpo' does not read its values" in line


@pytest.mark.parametrize(
    ("override", "start"),
    [
        ("critic.cliprange_value=0", "critic.cliprange_value=0.0 is out of range"),
        ("critic.grad_clip=-1", "critic.grad_clip=-1.0 is out of range"),
        ("trainer.critic_warmup=-2", "trainer.critic_warmup=-2 is out of range"),
        ("critic.loss_agg_mode=token-norm", "critic.loss_agg_mode='token-norm' is not one of"),
        ("critic.forward_micro_batch_size_per_gpu=0", "critic.forward_micro_batch_size_per_gpu=0"),
        ("critic.optim.lr=-1", "critic.optim.lr must be >= 0"),
        ("critic.model.path=/no/such/model", "critic.model.path='/no/such/model' does not exist"),
    ],
)
def test_critic_ranges(override: str, start: str):
    assert one_problem(override).startswith(start)


def test_critic_mini_batches_split_over_the_critic_ranks():
    assert problems("critic.ppo_mini_batch_size=3") == [
        "data.train_batch_size 8 is not divisible by critic.ppo_mini_batch_size 3: every "
        "mini-batch must be full",
        "per-GPU mini-batch 6 (= critic.ppo_mini_batch_size 3 x rollout.n 4 / world 2) is not "
        "divisible by critic.ppo_micro_batch_size_per_gpu 8; pick a divisor of 6 or set "
        "critic.use_dynamic_bsz=true",
    ]
    assert problems("critic.ppo_mini_batch_size=3", "critic.use_dynamic_bsz=true") == [
        "data.train_batch_size 8 is not divisible by critic.ppo_mini_batch_size 3: every "
        "mini-batch must be full"
    ]


def test_critic_fsdp_settings_are_checked_when_they_differ_from_the_actors():
    # offload set apart is accepted (both offloaded; the notice is engine_fsdp's test_fsdp_units')
    assert problems("critic.model.fsdp_config.optimizer_offload=true") == []
    line = one_problem("critic.model.fsdp_config.fsdp_size=3")
    assert line.startswith("critic.model.fsdp_config.fsdp_size=3 does not divide the 2 ranks")
