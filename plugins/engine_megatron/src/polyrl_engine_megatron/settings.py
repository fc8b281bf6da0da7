"""The Megatron engine's config sections at verl's places, ``megatron`` of the actor, the
reference and the critic, and the engine kit's LoRA keys of the model (mounted into the schema
by :mod:`polyrl.config.sections`). Light on purpose (no torch or megatron import): every
composed config imports it.

verl's keys that this engine does not implement are declared here with verl's defaults, so
that a verl command line is understood; a value other than the default is refused in one line
by ``polyrl validate`` (:mod:`polyrl.config.verl_compat` names the feature and what to use). The
reference's and the critic's settings default to the actor's, key by key, as in verl.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from polyrl_engine_kit.settings import LORA_SECTIONS

ACTOR_MEGATRON = "actor_rollout_ref.actor.megatron"
ACTOR_OPTIMIZER_OVERRIDES = "actor_rollout_ref.actor.optim.override_optimizer_config"
ACTOR_ROUTER_REPLAY = "actor_rollout_ref.actor.router_replay"
REF_MEGATRON = "actor_rollout_ref.ref.megatron"
MODEL_LORA = "actor_rollout_ref.model.lora"
CRITIC_MEGATRON = "critic.megatron"


@dataclass
class MegatronSettings:
    """How the model is split over the workers of its pool; the data-parallel size is the rest:
    workers / (tensor x pipeline x context).

    ``use_mbridge``: weights are converted from the Hugging Face folder (polyrl's own converter
    does what verl's mbridge does). ``use_dist_checkpointing``: the initial weights come from
    the megatron-core dist checkpoint at ``dist_checkpointing_path`` instead (its keys under
    ``dist_checkpointing_prefix``; :mod:`.dist_checkpoint`); the model's shape still comes from
    the HF config of ``model.path``. ``sequence_parallel`` and ``use_distributed_optimizer`` are
    megatron-core's defaults here. ``seed``: megatron-core's tensor-parallel RNG seed.
    """

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Any = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: Any = None
    sequence_parallel: bool = True
    use_distributed_optimizer: bool = True
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    use_mbridge: bool = True
    use_dist_checkpointing: bool = False
    dist_checkpointing_path: Any = None
    dist_checkpointing_prefix: str = ""
    seed: int = 42
    override_transformer_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimizerOverrides:
    """verl's ``optim.override_optimizer_config``: the keys of megatron-core's
    ``OptimizerConfig`` that verl's Megatron scripts set, at megatron-core's defaults (read by
    :mod:`.cpu_optimizer`, judged by :func:`.checks.optimizer_override_lines`).

    ``optimizer_cpu_offload``: the AdamW step of the first ``optimizer_offload_fraction`` of the
    parameters (by element count, in the model's order, as megatron-core's hybrid optimizer
    takes them) runs on float32 host copies, whose moments live in host memory; the updated
    weights are copied back. ``pin_cpu_grads`` / ``pin_cpu_params``: those host copies in
    page-locked memory (CUDA). The rest has no effect here or is refused: the engine's master
    weights, gradients and moments are float32 already (``use_precision_aware_optimizer`` with
    the float32 dtypes changes nothing; other dtypes are refused), the host step is torch's
    AdamW either way, and the copies are asynchronous either way.
    """

    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 0.0
    overlap_cpu_optimizer_d2h_h2d: bool = False
    use_precision_aware_optimizer: bool = False
    use_torch_optimizer_for_cpu_offload: bool = False
    pin_cpu_grads: bool = True
    pin_cpu_params: bool = True
    main_grads_dtype: str = "float32"
    main_params_dtype: str = "float32"
    exp_avg_dtype: str = "float32"
    exp_avg_sq_dtype: str = "float32"


# verl's Megatron LoRA group: the linears it adapts here and the values its keys take
LORA_COLUMN_PARALLEL = ("linear_qkv", "linear_fc1")
LORA_ROW_PARALLEL = ("linear_proj", "linear_fc2")
LORA_INIT_METHODS = ("xavier", "kaiming", "normal", "zero")
LORA_DROPOUT_POSITIONS = ("pre", "post")


@dataclass
class MegatronLora:
    """verl's Megatron LoRA group (``actor_rollout_ref.model.lora``, Megatron-Bridge's
    ``LoRA``), read by this engine for the actor (:mod:`.lora`). ``rank`` 0: full fine-tuning.
    Adapters go on the linears that ``target_modules`` names (megatron-core's names, or
    ``*`` patterns over full module names such as ``*.layers.0.*.linear_qkv``), the update scaled
    by ``alpha / rank``; ``dropout`` before the adapter (``dropout_position=pre``) or on its
    output (``post``); ``lora_A_init_method`` / ``lora_B_init_method``: ``xavier``,
    ``kaiming``, ``normal`` or ``zero``. ``merge``: verl syncs merged weights instead of the
    adapters; here the rollout always gets merged weights. The ``freeze_*`` keys belong to
    ``type=vlm_lora`` (false is refused: no part trains besides the adapters). What this
    engine does not implement is refused by :func:`.checks.lora_problems`."""

    type: str = "lora"
    merge: bool = False
    rank: int = 0
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: Any = field(
        default_factory=lambda: ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    )
    exclude_modules: Any = field(default_factory=list)
    dropout_position: str = "pre"
    lora_A_init_method: str = "xavier"
    lora_B_init_method: str = "zero"
    a2a_experimental: bool = False
    dtype: Any = None
    adapter_path: Any = None
    freeze_vision_model: bool = True
    freeze_vision_projection: bool = True
    freeze_language_model: bool = True


@dataclass
class RouterReplaySettings:
    """verl's ``actor_rollout_ref.actor.router_replay`` (read by this engine for the actor,
    :mod:`.router_replay`): ``mode=R2`` records the experts each token is routed to by the old
    log-prob pass and routes the update's forward passes to them; ``disabled`` routes afresh.
    R3 (the rollout engine's routing) and verl's routing dump files are refused by
    :func:`.checks.router_replay_problems`."""

    mode: str = "disabled"
    record_file: Any = None
    replay_file: Any = None


def _following_actor() -> MegatronSettings:
    values: dict[str, Any] = {
        f.name: f"${{{ACTOR_MEGATRON}.{f.name}}}"
        for f in fields(MegatronSettings)
        if f.name != "override_transformer_config"
    }
    return MegatronSettings(**values)


FOLLOWING_ACTOR = _following_actor()
CONFIG_SECTIONS = {
    **LORA_SECTIONS,  # read by the kit (the engine refuses lora_rank > 0: supports_lora=False)
    ACTOR_MEGATRON: MegatronSettings,
    REF_MEGATRON: FOLLOWING_ACTOR,
    CRITIC_MEGATRON: FOLLOWING_ACTOR,
    ACTOR_OPTIMIZER_OVERRIDES: OptimizerOverrides,
    ACTOR_ROUTER_REPLAY: RouterReplaySettings,
    MODEL_LORA: MegatronLora,
}
