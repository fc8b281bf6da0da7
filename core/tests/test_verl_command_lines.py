"""verl command lines that polyrl accepts today, kept as a list: each must keep validating, with
the same meaning (the values land on the same keys), through every change of where keys are
declared. Model and data point at the offline builtins; everything else is verl's spelling from
its example scripts (GRPO, PPO with a critic, DAPO, REINFORCE++, RLOO)."""

from __future__ import annotations

import pytest

from polyrl.config import load_config
from polyrl.config.validate import validate_config

OFFLINE = [
    "data.train_files=builtin:tiny_digits",
    "data.val_files=builtin:tiny_digits",
    "actor_rollout_ref.model.path=builtin:tiny",
    "trainer.n_gpus_per_node=2",
    "trainer.nnodes=1",
    "trainer.device=cpu",
]

COMMON = [
    "data.train_batch_size=8",
    "data.max_prompt_length=64",
    "data.max_response_length=16",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "trainer.logger=console",
    "trainer.project_name=verl_example",
    "trainer.experiment_name=tiny",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=1",
    "trainer.critic_warmup=0",
]

LINES = {
    "grpo": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "algorithm.use_kl_in_reward=False",
    ],
    "ppo": [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.rollout.n=1",
        "critic.optim.lr=1e-5",
        "critic.model.use_remove_padding=True",
        "critic.model.path=builtin:tiny",
        "critic.model.enable_gradient_checkpointing=True",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.model.fsdp_config.param_offload=False",
        "algorithm.use_kl_in_reward=False",
    ],
    "dapo": [
        "algorithm.adv_estimator=grpo",
        "algorithm.name=dapo",
        "actor_rollout_ref.rollout.n=4",
        "data.gen_batch_size=12",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=10",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.clip_ratio_c=10.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.use_kl_in_reward=False",
        "reward_model.overlong_buffer.enable=True",
        "reward_model.overlong_buffer.len=4",
        "reward_model.overlong_buffer.penalty_factor=1.0",
    ],
    "reinforce_plus_plus": [
        "algorithm.adv_estimator=reinforce_plus_plus",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_type=mse",
        "algorithm.use_kl_in_reward=False",
    ],
    "rloo": [
        "algorithm.adv_estimator=rloo",
        "actor_rollout_ref.rollout.n=4",
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_penalty=kl",
        "algorithm.kl_ctrl.kl_coef=0.001",
    ],
}

# What each line must mean: key -> value after composition.
MEANING = {
    "grpo": {"actor_rollout_ref.actor.kl_loss_type": "low_var_kl", "trainer.logger": ["console"]},
    "ppo": {"critic.optim.lr": 1e-5, "critic.model.fsdp_config.param_offload": False},
    "dapo": {
        "algorithm.filter_groups.metric": "acc",
        "actor_rollout_ref.actor.clip_ratio_high": 0.28,
    },
    "reinforce_plus_plus": {"actor_rollout_ref.actor.kl_loss_type": "mse"},
    "rloo": {"algorithm.kl_ctrl.kl_coef": 0.001},
}


@pytest.mark.parametrize("name", sorted(LINES))
def test_a_verl_command_line_validates_with_its_meaning(name: str) -> None:
    from omegaconf import OmegaConf

    cfg = load_config([*COMMON, *LINES[name], *OFFLINE])
    assert validate_config(cfg) == []
    for key, value in MEANING[name].items():
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == value, (key, got)
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload is True
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 2


def test_verls_global_micro_batch_sizes_are_divided_by_the_data_parallel_size() -> None:
    """verl's deprecated global keys, as its tuning scripts still set them: verl divides each by
    the data-parallel size (here 4 workers / TP 2 = 2) and uses the quotient per GPU."""
    from polyrl.errors import ConfigError

    base = [
        "actor_rollout_ref.model.path=builtin:tiny",
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size=8",
    ]
    cfg = load_config(
        [
            *base,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size=16",
            "actor_rollout_ref.ref.log_prob_micro_batch_size=6",
        ]
    )
    arr = cfg.actor_rollout_ref
    assert arr.actor.ppo_micro_batch_size_per_gpu == 4
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 8
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 3
    # a reference on a pool of its own with its own split: its own data-parallel size (3 / 1)
    cfg = load_config(
        [
            *base,
            "actor_rollout_ref.ref.log_prob_micro_batch_size=6",
            "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1",
            "+trainer.role_pools.ref=refpool",
            "+trainer.resource_pools.refpool=3",
        ]
    )
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 2
    with pytest.raises(ConfigError, match="both set"):
        load_config([*base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
