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

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

# Keys accepted only so that verl command lines still parse; polyrl ignores their values. Each
# entry is a dotted key (a group stands for every key below it). Anything not listed here is read
# by the code that the key configures (core/tests/test_config_declared.py checks both ways).
# The Megatron engine's verl keys that it does not implement are accepted at their defaults only
# (polyrl.config.verl_compat refuses, or notes, any other value).
VERL_COMPAT_KEYS: tuple[str, ...] = tuple(
    f"{role}.megatron.{key}"
    for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
    for key in ("sequence_parallel", "use_distributed_optimizer", "use_mbridge")
)


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class AlgorithmConfig:
    # null: the algorithm plugin that owns adv_estimator (polyrl.plan)
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
class SamplerConfig:
    """verl's custom sampler (polyrl.data.sampler): ``class_path`` (``pkg://dotted.module`` or a
    file path) and ``class_name``; null: data.shuffle's order."""

    class_path: Any = None
    class_name: Any = None


@dataclass
class CustomDatasetConfig:
    """verl's custom dataset class (polyrl.data.custom_dataset): ``path`` (``pkg://dotted.module``
    or a file path) and ``name``; null: the files are read as verl-format parquet."""

    path: Any = None
    name: Any = None


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
    # verl's extra keyword arguments of tokenizer.apply_chat_template when prompts are rendered
    # (read by the template: {enable_thinking: false}, {reasoning_effort: medium})
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Rows that cannot teach (a preference pair with identical or empty responses, a prompt whose
    # data_source has no scorer) are dropped with a count up to this share of a file's rows;
    # above it the run refuses to start (polyrl.data.unteachable).
    max_unteachable_share: float = 0.1
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    custom_cls: CustomDatasetConfig = field(default_factory=CustomDatasetConfig)


@dataclass
class ModelConfig:
    path: str = MISSING  # local HF folder, hub id, or .gguf file
    tokenizer_path: Any = None
    # verl's custom_chat_template: a Jinja chat template that replaces the tokenizer's own
    # wherever the policy's tokenizer renders chats (polyrl.data.chat_template); null: its own
    custom_chat_template: Any = None
    trust_remote_code: bool = False
    enable_gradient_checkpointing: bool = False
    # FSDP, DeepSpeed and Megatron engines: each micro-batch packed into one row of real tokens
    # (varlen attention on CUDA)
    use_remove_padding: bool = True
    # FSDP, DeepSpeed (ZeRO-1/2) and Megatron (packed rows; vocab-parallel with TP > 1)
    # engines: log-probs and entropy from hidden states, without fp32 full-vocabulary logits
    use_fused_kernels: bool = True
    dtype: str = "bfloat16"
    override_config: dict[str, Any] = field(default_factory=dict)
    # LoRA's keys (lora_rank, lora_alpha, target_modules, lora_dropout, export_merged_lora) are
    # declared by the training engines (polyrl_engine_kit.settings); see polyrl.lora.


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
    # verl's truncated importance sampling: each token's policy loss weighted by
    # min(pi_old / pi_rollout, cap), correcting for samples the rollout engine drew from another
    # policy (numerics, or one step behind with trainer.async_mode=one_step_off); -1: off
    tis_imp_ratio_cap: float = -1.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    # verl's: the old log-prob pass also computes sum_pi_squared (each response token's
    # sum over the vocabulary of squared probabilities, at the rollout temperature), which the
    # optimal-token-baseline estimators read; the engine's config check refuses it if it
    # cannot compute it
    calculate_sum_pi_squared: bool = False
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # FSDP engine, CUDA: each decoder layer's forward (and its backward) through torch.compile,
    # which fuses the element-wise ops Liger's kernels would and cuts the per-op launch cost;
    # Liger is then not patched in (a LoRA actor's layers stay eager). The fused log-probs
    # compile unless this is false. The first step pays the compile: ~40 s for the Qwen2-0.5B
    # shape on the H200, over 200 s for the 2-layer tiny model on a cold Inductor cache, whose
    # 0.15 s steps never repay it (recipe=tiny sets false)
    use_torch_compile: bool = True


@dataclass
class RefConfig:
    """The reference policy. Its engine is built from ``actor_rollout_ref.actor`` with these keys
    (and the engine plugins' sections here, such as ``fsdp_config``) merged over it; each
    defaults to the actor's value."""

    log_prob_micro_batch_size_per_gpu: int = (
        "${actor_rollout_ref.actor.log_prob_micro_batch_size_per_gpu}"  # type: ignore[assignment]
    )
    log_prob_max_token_len_per_gpu: int = (
        "${actor_rollout_ref.actor.log_prob_max_token_len_per_gpu}"  # type: ignore[assignment]
    )


@dataclass
class RolloutValConfig:
    """Validation sampling, as verl's rollout does it: greedy at ``temperature`` 0, sampled at
    a temperature above (with ``top_p``/``top_k``). verl's rollout does not read ``do_sample``,
    nor does polyrl (``polyrl validate`` says so when it is false beside a temperature above 0,
    and refuses true at temperature 0)."""

    do_sample: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1


@dataclass
class WeightSyncConfig:
    """The actor -> rollout weight sync after each update (polyrl.workers.weight_sync)."""

    # A sync between pools that does not finish in this time fails, naming the ranks and pools
    # that did not complete (also the timeout of each collective of the transport)
    timeout_s: float = 600.0
    # After each sync the rollout samples this many tokens of a fixed probe prompt and the actor
    # scores them: the max |log-prob difference| is the metric weight_sync/probe_logprob_max_diff,
    # an error above probe_tolerance (nats). 0: no probe. bf16 numerics alone reach ~1.5 nats on
    # a rare sampled token (SmolLM2, CPU); weights that did not arrive differ by far more
    probe_tokens: int = 4
    probe_tolerance: float = 5.0


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
    # verl 0.5-0.6's key: the most bytes of weights one request of a weight sync carries, for
    # engines that load the trainer's stream in buckets (sglang), and the bucket size of the
    # weight transport between pools (actor_rollout_ref.hybrid_engine=false)
    update_weights_bucket_megabytes: int = 512
    # The rollout's own pool with actor_rollout_ref.hybrid_engine=false (verl's keys): nnodes x
    # n_gpus_per_node workers (CPU worker processes with trainer.device=cpu); unread otherwise.
    nnodes: int = 1
    n_gpus_per_node: int = "${trainer.n_gpus_per_node}"  # type: ignore[assignment]
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    dtype: str = "bfloat16"
    seed: int = 0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    val_kwargs: RolloutValConfig = field(default_factory=RolloutValConfig)


@dataclass
class ActorRolloutRefConfig:
    # verl's key: true colocates actor, reference and rollout in one process per device; false
    # puts the rollout in a pool of its own (actor_rollout_ref.rollout.nnodes/n_gpus_per_node)
    hybrid_engine: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class RewardModelModelConfig:
    """The reward model: a sequence-classification model (``AutoModelForSequenceClassification``,
    one label) that reads the policy's tokens, so it must share the policy's tokenizer."""

    path: Any = None  # a local folder or hub id; required with reward_model.enable
    trust_remote_code: bool = False


@dataclass
class RewardModelConfig:
    # true: score every response with the reward model (the reward_model stage after reward);
    # refused when the selected algorithm's step has no reward_model role
    enable: bool = False
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size_per_gpu: int = 16  # rows per forward pass of the reward model
    # replace: the model's score is the reward (verl's rule) | sum: rule-based score + model score
    combine: str = "replace"
    reward_manager: str = "naive"
    num_workers: int = 2
    timeout_s: float = 10.0
    failure_score: float = 0.0
    on_error: str = "score"  # score: use failure_score and report | raise: stop the run
    # A hung scorer must not cost minutes per step: after this many timeouts in a row, the rest of
    # the step's samples are failed at once.
    max_consecutive_timeouts: int = 4
    # A run that learns nothing must not "succeed": it stops once the share of samples that failed
    # to score over the last failure_window_steps steps reaches max_failure_rate.
    max_failure_rate: float = 1.0
    failure_window_steps: int = 2
    # Where scoring functions run. auto: the built-in scorers (some evaluate model output) in
    # sandboxed workers, custom_reward_function in plain workers (the user's own code) | always:
    # both sandboxed (custom code marked untrusted) | never: plain workers for both (one line
    # names the scorers that then evaluate model output unsandboxed). num_workers=0 scores in
    # the driver only what is not sandboxed; the rest in one sandboxed child
    sandbox: str = "auto"
    sandbox_memory_mb: int = 4096  # address-space limit of one sandboxed reward worker


@dataclass
class CustomRewardFunctionConfig:
    path: Any = None
    name: str = "compute_score"
    # The file is imported once in a throwaway process before the run: an import that takes
    # longer (blocks, downloads, trains) is an error naming the file.
    load_timeout_s: float = 60.0


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
    # At each validation, this many of its samples (prompt, output, score, step) go to the
    # loggers: the same prompts every time (sorted by prompt, sampled with trainer.seed); jsonl
    # writes val_generations.jsonl, console a table, tensorboard text, wandb a Table, mlflow
    # an artifact; a logger without log_generations skips them. 0: none
    log_val_generations: int = 0
    resume_mode: str = "auto"  # auto | disable | resume_path
    resume_from_path: Any = None
    # A checkpoint whose files fail their checksums: false stops with the file named; true
    # resumes from the newest older checkpoint that is intact.
    resume_fallback: bool = False
    # Resuming with a different model, algorithm, rollout.n, batch or data is refused (the result
    # would not be the run the checkpoint belongs to) unless this is true; other changes are
    # reported.
    resume_allow_changes: bool = False
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    max_actor_ckpt_to_keep: Any = None
    export_hf_model: bool = True
    # Every checkpoint also holds its policy as a Hugging Face folder (<checkpoint>/hf_model),
    # written from the trained weights while the checkpoint is saved; verl's
    # checkpoint.save_contents=[..., hf_model]
    export_hf_every_save: bool = False
    seed: int = 1
    ray_init: dict[str, Any] = field(default_factory=dict)
    # A joined cluster (RAY_ADDRESS) lacking what a pool asks may grow (an autoscaler, a node being
    # started) for this long before the run stops with one line; a cluster the run started
    # itself cannot grow and fails at once
    joined_cluster_growth_s: float = 30.0
    # ray: every pool's workers are Ray actors (processes of their own). in_process: each
    # pool's one worker runs in this process, without Ray (no cluster to start, no worker
    # process to import torch again; a debugger stops in worker code): for pools of one worker
    # (nnodes=1, n_gpus_per_node=1; several pools on the CPU only), trainer.max_restarts=0
    worker_backend: str = "ray"  # ray | in_process
    collective_timeout_s: float = 1800.0  # torch.distributed timeout: a stuck rank fails, not hangs
    # A worker lost (killed, out of memory, node gone): restart every worker and resume from the
    # run's newest complete checkpoint, at most this many times per run (0: the run ends)
    max_restarts: int = 0
    # Placement: role -> resource pool. Roles not listed share the "global" pool of
    # nnodes x n_gpus_per_node workers, one process per device hosting all of them (colocated,
    # verl's hybrid engine). A pool named here needs its size in resource_pools.
    role_pools: dict[str, str] = field(default_factory=dict)
    resource_pools: dict[str, int] = field(default_factory=dict)  # pool -> workers (devices)
    # sync: each step generates with the weights of the previous update, then trains on them.
    # one_step_off: step k+1's batch is generated (by the policy one update behind) while step k
    # trains; needs the rollout in a pool of its own and actor_rollout_ref.actor.tis_imp_ratio_cap
    async_mode: str = "sync"


@dataclass
class PolyrlConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(
        default_factory=CustomRewardFunctionConfig
    )
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    plugins: dict[str, Any] = field(default_factory=dict)
