"""The structured config: verl's groups and key names, with types and defaults.

This is the one place where config keys and their defaults are declared: code reads config nodes
built from these dataclasses by attribute (``cfg.actor_rollout_ref.actor.ppo_epochs``) and never
restates a default. A default may be an interpolation of another key (``${...}``), resolved when
the config is composed. ``core/tests/test_config_declared.py`` fails when code reads a key that
is not declared here, or when a declared key is read nowhere and is not listed in
:data:`VERL_COMPAT_KEYS`.

Every plugin is picked by name through one of these keys (see :class:`polyrl.specs.PluginKind`).
A plugin's own knobs go under ``plugins.<name>`` (free-form, checked against the plugin's
``config_class`` when it declares one). Hydra rejects keys that are not declared here; polyrl
turns that into a message with the closest valid key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import MISSING

# Keys accepted only so that verl command lines still parse; polyrl ignores their values. Each
# entry is a dotted key (a group stands for every key below it). Anything not listed here is read
# by the code that the key configures (core/tests/test_config_declared.py checks both ways).
VERL_COMPAT_KEYS: tuple[str, ...] = (
    # verl's switch for padding-free (rmpad) forward passes; polyrl's engines always trim padding
    # columns (FSDP) or generate without padding (vLLM), so there is nothing to switch.
    "actor_rollout_ref.model.use_remove_padding",
    # Discount and GAE lambda. No estimator shipped with polyrl uses them (GRPO, Dr.GRPO and RLOO
    # score whole responses); an estimator plugin receives the whole ``algorithm`` node and may.
    "algorithm.gamma",
    "algorithm.lam",
    # verl's critic (value model) settings. No algorithm has a critic role yet: these keys parse
    # so that verl PPO command lines reach the real message (``polyrl validate`` refuses
    # critic.enable=true and names the algorithm that would need a critic).
    "critic.strategy",
    "critic.ppo_mini_batch_size",
    "critic.ppo_micro_batch_size_per_gpu",
    "critic.ppo_epochs",
    "critic.cliprange_value",
    "critic.optim",
    "critic.model",
)


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class AlgorithmConfig:
    # null: the algorithm plugin that owns adv_estimator (polyrl.step.algorithm)
    name: Any = None
    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    # kl (k1) | abs | mse (k2) | low_var_kl (k3), each also with "+" (k2's gradient): k3+
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)


@dataclass
class DataConfig:
    train_files: Any = MISSING  # a path or a list of paths
    val_files: Any = None
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 512
    max_response_length: int = 256
    train_batch_size: int = 8
    val_batch_size: Any = None  # None: the whole val set at once
    filter_overlong_prompts: bool = True
    truncation: str = "error"  # error | left | right (when not filtering)
    shuffle: bool = True
    seed: int = 1
    apply_chat_template: bool = True


@dataclass
class ModelConfig:
    path: str = MISSING  # local HF folder, hub id, or .gguf file
    tokenizer_path: Any = None
    trust_remote_code: bool = False
    enable_gradient_checkpointing: bool = False
    use_remove_padding: bool = True  # in VERL_COMPAT_KEYS: accepted and ignored
    dtype: str = "bfloat16"
    override_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_warmup_steps: int = -1  # -1: use lr_warmup_steps_ratio
    lr_warmup_steps_ratio: float = 0.0
    lr_scheduler_type: str = "constant"  # constant | cosine (after warm-up); verl's newer name
    # verl's older name of lr_scheduler_type, for older command lines: when set it wins (as in
    # verl, which deprecates it); null: lr_scheduler_type decides.
    warmup_style: Any = None
    min_lr_ratio: float = 0.0
    clip_grad: float = 1.0


@dataclass
class FSDPConfig:
    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True
    mixed_precision: bool = True  # fp32 master weights, bf16 compute
    fsdp_size: int = -1


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"


@dataclass
class ActorConfig:
    strategy: str = "fsdp2"
    ppo_mini_batch_size: int = 8  # in prompts, as in verl (multiplied by rollout.n)
    ppo_micro_batch_size_per_gpu: int = 4
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    # The actor's forward passes without grad (old log-probs): verl sets these through
    # actor_rollout_ref.rollout.log_prob_*, which they follow unless set here.
    log_prob_micro_batch_size_per_gpu: int = (
        "${actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu}"  # type: ignore[assignment]
    )
    log_prob_max_token_len_per_gpu: int = (
        "${actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu}"  # type: ignore[assignment]
    )
    ppo_epochs: int = 1
    shuffle: bool = False
    clip_ratio: float = 0.2
    clip_ratio_low: Any = None  # None: clip_ratio
    clip_ratio_high: Any = None  # None: clip_ratio
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


def _follow_actor_fsdp() -> FSDPConfig:
    """The reference's FSDP settings default to the actor's (each key can be set for the ref)."""
    values: dict[str, Any] = {
        f.name: f"${{actor_rollout_ref.actor.fsdp_config.{f.name}}}" for f in fields(FSDPConfig)
    }
    return FSDPConfig(**values)


@dataclass
class RefConfig:
    """The reference policy. Its engine is built from ``actor_rollout_ref.actor`` with these keys
    merged over it; each defaults to the actor's value."""

    log_prob_micro_batch_size_per_gpu: int = (
        "${actor_rollout_ref.actor.log_prob_micro_batch_size_per_gpu}"  # type: ignore[assignment]
    )
    log_prob_max_token_len_per_gpu: int = (
        "${actor_rollout_ref.actor.log_prob_max_token_len_per_gpu}"  # type: ignore[assignment]
    )
    fsdp_config: FSDPConfig = field(default_factory=_follow_actor_fsdp)


@dataclass
class RolloutValConfig:
    do_sample: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1


@dataclass
class RolloutConfig:
    name: str = "hf"
    n: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    # verl's keys for the actor's old log-probs (actor_rollout_ref.actor.log_prob_* follow them)
    log_prob_micro_batch_size_per_gpu: int = (
        "${actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu}"  # type: ignore[assignment]
    )
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    micro_batch_size: int = 64  # prompts per generate() call of the HF engine
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 1
    enforce_eager: bool = True
    free_cache_engine: bool = True
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    enable_prefix_caching: bool = True
    dtype: str = "bfloat16"
    seed: int = 0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    val_kwargs: RolloutValConfig = field(default_factory=RolloutValConfig)


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class CriticConfig:
    # true: train a value model; refused unless the selected algorithm's step has a critic role.
    # The other keys are in VERL_COMPAT_KEYS.
    enable: bool = False
    strategy: str = "fsdp2"
    ppo_mini_batch_size: int = 8
    ppo_micro_batch_size_per_gpu: int = 4
    ppo_epochs: int = 1
    cliprange_value: float = 0.5
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    model: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardModelConfig:
    # true: score with a model; refused unless the selected algorithm's step has that role
    enable: bool = False
    reward_manager: str = "naive"
    num_workers: int = 2
    timeout_s: float = 10.0
    failure_score: float = 0.0
    on_error: str = "score"  # score: use failure_score and report | raise: stop the run


@dataclass
class CustomRewardFunctionConfig:
    path: Any = None
    name: str = "compute_score"


@dataclass
class TrainerConfig:
    project_name: str = "polyrl"
    experiment_name: str = "run"
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    nnodes: int = 1
    n_gpus_per_node: int = 1
    device: str = "cpu"  # cpu | cuda
    total_epochs: int = 1
    total_training_steps: Any = None  # None: epochs x batches per epoch
    save_freq: int = -1
    test_freq: int = -1
    val_before_train: bool = True
    resume_mode: str = "auto"  # auto | disable | resume_path
    resume_from_path: Any = None
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    max_actor_ckpt_to_keep: Any = None
    export_hf_model: bool = True
    seed: int = 1
    ray_init: dict[str, Any] = field(default_factory=dict)
    collective_timeout_s: float = 1800.0  # torch.distributed timeout: a stuck rank fails, not hangs
    # Placement: role -> resource pool. Roles not listed share the "global" pool of
    # nnodes x n_gpus_per_node workers, one process per device hosting all of them (colocated,
    # verl's hybrid engine). A pool named here needs its size in resource_pools.
    role_pools: dict[str, str] = field(default_factory=dict)
    resource_pools: dict[str, int] = field(default_factory=dict)  # pool -> workers (devices)


@dataclass
class PolyrlConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(
        default_factory=CustomRewardFunctionConfig
    )
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    plugins: dict[str, Any] = field(default_factory=dict)
