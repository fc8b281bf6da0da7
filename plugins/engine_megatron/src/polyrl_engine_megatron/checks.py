"""The Megatron engine's rules for a run config (``TrainingEngineSpec.config_check``).

Light on purpose (no torch, no megatron): ``polyrl validate`` imports it. The parallel sizes are
verl's keys ``actor_rollout_ref.actor.megatron.*``; the engine-neutral rules (micro-batch keys,
AdamW betas) are polyrl-engine-fsdp's pure helpers, so the engines word them alike. Core refuses
``trainer.device=cpu`` for this engine (its spec says CUDA only).
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from polyrl.api import pool_of, role_world
from polyrl_engine_kit.checks import DTYPES, actor_ref_problems, dtype_name, positive_int
from polyrl_engine_megatron.settings import (
    LORA_COLUMN_PARALLEL,
    LORA_DROPOUT_POSITIONS,
    LORA_INIT_METHODS,
    LORA_ROW_PARALLEL,
    MODEL_LORA,
)
from polyrl_engine_megatron.transformer_overrides import split, uneven_stage_problems

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
MEGATRON = f"{ACTOR}.megatron"
REF_MEGATRON = f"{REF}.megatron"
OPTIMIZER_OVERRIDES = f"{ACTOR}.optim.override_optimizer_config"
FLOAT32 = ("float32", "fp32", "torch.float32")
DTYPES_SUPPORTED = ("bfloat16", "float32")
NOT_SUPPORTED = "polyrl does not support it"


def parallel_problems(megatron: Any, node: str = MEGATRON) -> list[str]:
    """The tensor/pipeline-parallel sizes themselves (the engine raises these too); ``node``:
    where ``megatron`` sits in the config, for the message."""
    problems = [
        f"{node}.{key} must be a positive integer, got {getattr(megatron, key)!r}"
        for key in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "expert_model_parallel_size",
            "context_parallel_size",
        )
        if not positive_int(getattr(megatron, key))
    ]
    expert_tensor = megatron.expert_tensor_parallel_size
    if expert_tensor not in (None, 1):
        problems.append(
            f"{node}.expert_tensor_parallel_size={expert_tensor} asks for MoE expert tensor "
            f"parallelism (verl); polyrl does not support it: use expert_tensor_parallel_size=1 "
            f"or null (each expert whole on its expert-parallel rank)"
        )
    virtual = megatron.virtual_pipeline_model_parallel_size
    if virtual is not None and not positive_int(virtual):
        problems.append(
            f"{node}.virtual_pipeline_model_parallel_size must be null or a positive integer "
            f"(model chunks per pipeline stage), got {virtual!r}"
        )
    elif virtual_size(megatron) and megatron.pipeline_model_parallel_size == 1:
        problems.append(
            f"{node}.virtual_pipeline_model_parallel_size={virtual} interleaves the chunks of "
            f"several pipeline stages, but pipeline_model_parallel_size is 1; set it > 1 or "
            f"leave virtual_pipeline_model_parallel_size unset"
        )
    return problems


def virtual_size(megatron: Any) -> int | None:
    """Model chunks per pipeline stage with interleaving; None without (unset, or 1: one chunk
    per stage is the plain schedule)."""
    virtual = megatron.virtual_pipeline_model_parallel_size
    return None if virtual in (None, 1) else int(virtual)


def dtype_problem(model: Any) -> str | None:
    name = DTYPES.get(dtype_name(model))
    if name in DTYPES_SUPPORTED:
        return None
    return (
        f"actor_rollout_ref.model.dtype={dtype_name(model)!r}: the Megatron engine computes in "
        f"bfloat16 or float32 (float32 master weights either way); use one of those"
    )


def optimizer_override_lines(overrides: Any) -> tuple[list[str], list[str]]:
    """``(problems, notices)`` of ``optim.override_optimizer_config`` (a
    :class:`.settings.OptimizerOverrides` node), one line each."""
    problems, notices = [], []
    fraction = overrides.optimizer_offload_fraction
    if not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        problems.append(
            f"{OPTIMIZER_OVERRIDES}.optimizer_offload_fraction={fraction!r}: give the share of "
            f"the parameters whose optimizer step runs on the CPU, from 0.0 to 1.0"
        )
    for key in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        value = str(getattr(overrides, key))
        if value not in FLOAT32:
            problems.append(
                f"{OPTIMIZER_OVERRIDES}.{key}={value} asks for lower-precision optimizer state "
                f"(verl's precision-aware optimizer); polyrl does not support it: the Megatron "
                f"engine keeps float32 master weights, gradients and moments, use float32"
            )
    why = {
        "use_precision_aware_optimizer": "the master weights, gradients and moments are float32 "
        "already, the precision-aware optimizer's defaults",
        "overlap_cpu_optimizer_d2h_h2d": "the copies between the GPU and pinned host memory "
        "are asynchronous either way; the host step starts once the gradients are there",
        "use_torch_optimizer_for_cpu_offload": "the host step is torch's AdamW either way",
    }
    notices += [
        f"{OPTIMIZER_OVERRIDES}.{key}=True (verl) has no effect in polyrl: {reason}"
        for key, reason in why.items()
        if bool(getattr(overrides, key))
    ]
    if fraction and not overrides.optimizer_cpu_offload:
        notices.append(
            f"{OPTIMIZER_OVERRIDES}.optimizer_offload_fraction={fraction} (verl) has no effect "
            f"in polyrl without optimizer_cpu_offload=true, as in megatron-core"
        )
    return problems, notices


def dist_checkpoint_problems(megatron: Any, node: str) -> list[str]:
    """``use_dist_checkpointing`` needs ``dist_checkpointing_path`` (one line)."""
    if not megatron.use_dist_checkpointing or megatron.dist_checkpointing_path not in (None, ""):
        return []
    return [
        f"{node}.use_dist_checkpointing=true needs {node}.dist_checkpointing_path, the folder of "
        f"a megatron-core dist checkpoint (verl's converter writes one)"
    ]


def lora_problems(lora: Any) -> list[str]:
    """One line per key of verl's Megatron LoRA group (a :class:`.settings.MegatronLora`
    node) that this engine cannot honour; none with ``rank`` 0 (LoRA off: the rest unread, as
    in verl)."""
    rank = lora.rank
    if not positive_int(rank) and rank != 0:
        return [f"{MODEL_LORA}.rank={rank!r} must be an integer >= 0 (0: LoRA off), e.g. 32"]
    if rank == 0:
        return []
    refused = f"(verl); {NOT_SUPPORTED}"
    problems = []
    if lora.type != "lora":
        problems.append(
            f"{MODEL_LORA}.type={lora.type} asks for {lora.type} adapters {refused}: use "
            f"type=lora (one adapter per fused linear)"
        )
    if not isinstance(lora.alpha, (int, float)) or lora.alpha <= 0:
        problems.append(f"{MODEL_LORA}.alpha={lora.alpha!r} must be a number > 0, e.g. 64")
    if not isinstance(lora.dropout, (int, float)) or not 0 <= lora.dropout < 1:
        problems.append(f"{MODEL_LORA}.dropout={lora.dropout!r} must be in [0, 1), e.g. 0.0")
    if lora.dropout_position not in LORA_DROPOUT_POSITIONS:
        problems.append(
            f"{MODEL_LORA}.dropout_position={lora.dropout_position!r} must be pre or post"
        )
    for key in ("lora_A_init_method", "lora_B_init_method"):
        if lora[key] not in LORA_INIT_METHODS:
            problems.append(
                f"{MODEL_LORA}.{key}={lora[key]!r} must be one of {', '.join(LORA_INIT_METHODS)}"
            )
    linears = LORA_COLUMN_PARALLEL + LORA_ROW_PARALLEL
    targets = lora.target_modules
    names = list(targets) if OmegaConf.is_list(targets) or isinstance(targets, list) else None
    if not names or not all(isinstance(t, str) and t for t in names):
        problems.append(
            f"{MODEL_LORA}.target_modules={targets!r} must be a non-empty list of "
            f"{', '.join(linears)} or patterns such as '*.layers.0.*.linear_qkv'"
        )
    else:
        unknown = [t for t in names if "*" not in t and t not in linears]
        if unknown:
            problems.append(
                f"{MODEL_LORA}.target_modules names {', '.join(unknown)}: adapters on other "
                f"modules than {', '.join(linears)} (canonical LoRA's split linears, MLA's, "
                f"the MoE router) {refused}: use those four"
            )
    # key -> (set otherwise than verl's default, the feature, what to do instead)
    given = {
        "exclude_modules": (
            bool(lora.exclude_modules),
            "adapting every linear but the excluded ones",
            "list the adapted linears in target_modules",
        ),
        "a2a_experimental": (
            bool(lora.a2a_experimental),
            "LoRA's all-to-all under sequence parallelism",
            "leave it false (the adapters gather and scatter the sequence as their linears do)",
        ),
        "adapter_path": (
            lora.adapter_path not in (None, ""),
            "starting from saved Megatron adapters",
            "leave it null (fresh adapters)",
        ),
        "dtype": (
            lora.dtype is not None and str(lora.dtype) not in FLOAT32,
            "adapters stored in a lower precision",
            "leave it null (float32 adapters, computed in actor_rollout_ref.model.dtype)",
        ),
        "freeze_vision_model": (
            not lora.freeze_vision_model,
            "training a vision model beside the adapters (vlm_lora)",
            "leave it true",
        ),
        "freeze_vision_projection": (
            not lora.freeze_vision_projection,
            "training a vision projection beside the adapters (vlm_lora)",
            "leave it true",
        ),
        "freeze_language_model": (
            not lora.freeze_language_model,
            "training the whole language model beside the adapters (vlm_lora)",
            "leave it true (the adapters alone train)",
        ),
    }
    problems += [
        f"{MODEL_LORA}.{key}={lora[key]} asks for {feature} {refused}: {instead}"
        for key, (changed, feature, instead) in given.items()
        if changed
    ]
    return problems


# tensor, pipeline, virtual (or None), expert, context
def router_replay_problems(replay: Any) -> list[str]:
    """verl's ``actor.router_replay`` (a :class:`.settings.RouterReplaySettings` node): R2 or
    disabled; R3 and the routing files one line each."""
    node = f"{ACTOR}.router_replay"
    problems = []
    if replay.mode == "R3":
        problems.append(
            f"{node}.mode=R3 asks for MoE router replay from the rollout engine's routing "
            f"(verl); {NOT_SUPPORTED}: use mode=R2 (the routing of the old log-prob pass)"
        )
    elif replay.mode not in ("disabled", "R2"):
        problems.append(f"{node}.mode={replay.mode!r} must be disabled, R2 or R3 (verl's modes)")
    problems += [
        f"{node}.{key}={replay[key]} asks for dumping or loading MoE routing files (verl); "
        f"{NOT_SUPPORTED}: remove it (R2 keeps the routing in memory)"
        for key in ("record_file", "replay_file")
        if replay[key] not in (None, "")
    ]
    return problems


Sizes = tuple[int, int, int | None, int, int]


def _sizes(megatron: Any) -> Sizes:
    return (
        int(megatron.tensor_model_parallel_size),
        int(megatron.pipeline_model_parallel_size),
        virtual_size(megatron),
        int(megatron.expert_model_parallel_size),
        int(megatron.context_parallel_size),
    )


def _shown(sizes: Sizes) -> str:
    tensor, pipeline, virtual, experts, context = sizes
    more = [f"{virtual} chunks per stage"] if virtual is not None else []
    more += [f"expert parallel {experts}"] if experts > 1 else []
    more += [f"context parallel {context}"] if context > 1 else []
    return f"{tensor} x {pipeline}" + (f" ({', '.join(more)})" if more else "")


def _world_problems(cfg: Any) -> list[str]:
    """Each role's TP x PP divides its pool; a reference split otherwise than the actor runs in
    a pool of its own (megatron-core's parallel state is one per process)."""
    problems = []
    seen: set[tuple[int, str, Sizes]] = set()
    arr = cfg.actor_rollout_ref
    sizes = {"actor": _sizes(arr.actor.megatron), "ref": _sizes(arr.ref.megatron)}
    for role, node in (("actor", MEGATRON), ("ref", REF_MEGATRON)):
        found = role_world(cfg, role)
        if found is None or (*found, sizes[role]) in seen:
            continue
        seen.add((*found, sizes[role]))
        workers, where = found
        tensor_parallel, pipeline_parallel, _, experts, context = sizes[role]
        model_copy = tensor_parallel * pipeline_parallel * context
        if workers % model_copy:
            split = f"{node}.tensor_model_parallel_size={tensor_parallel}"
            if pipeline_parallel > 1:
                split += f" x pipeline_model_parallel_size={pipeline_parallel}"
            if context > 1:
                split += f" x context_parallel_size={context}"
            problems.append(
                f"{split} does not divide the {workers} workers of the {role} ({where}); the "
                f"data-parallel size is workers / (tensor x pipeline x context parallel size)"
            )
        elif (workers // pipeline_parallel) % experts:
            problems.append(
                f"{node}.expert_model_parallel_size={experts} does not divide the "
                f"{workers // pipeline_parallel} tensor x data-parallel ranks of a pipeline stage "
                f"of the {role} ({where}); megatron-core spreads the experts over them (expert "
                f"tensor parallelism 1)"
            )
    if sizes["ref"] != sizes["actor"] and pool_of(cfg, "ref") == pool_of(cfg, "actor"):
        problems.append(
            f"{REF_MEGATRON} tensor x pipeline parallel size {_shown(sizes['ref'])} differs "
            f"from the actor's {_shown(sizes['actor'])}, but both run in pool "
            f"{pool_of(cfg, 'ref')!r}, where one "
            f"process holds both and megatron-core keeps one split per process: put the "
            f"reference on a pool of its own (trainer.role_pools.ref=<pool> with "
            f"trainer.resource_pools.<pool>=<workers>) or give it the actor's sizes"
        )
    return problems


# The actor's settings that shape the critic's engine too. verl's other megatron keys are refused
# or have no effect on their own, for any role (``polyrl validate`` says which).
_SHAPING = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "param_offload",
    "grad_offload",
    "optimizer_offload",
    "override_transformer_config",
)


def _critic_problems(cfg: Any) -> list[str]:
    """A Megatron critic runs with the actor's ``megatron`` settings (its engine node is the
    actor's with the critic's batch and optimizer keys over it): a ``critic.megatron`` setting
    that shapes the engine, set otherwise, is refused, not ignored."""
    critic = cfg.get("critic")
    if critic is None or "megatron" not in critic:
        return []
    actor = cfg.actor_rollout_ref.actor.megatron
    overrides = "override_transformer_config"
    return [
        f"critic.megatron.{key}={critic.megatron[key]} differs from the actor's "
        f"{actor[key]} and asks for a critic split, offloaded or configured otherwise than the "
        f"actor (verl); polyrl does not support it: the critic runs with {MEGATRON}'s "
        f"settings, leave critic.megatron.{key} unset"
        for key in critic.megatron
        if key in _SHAPING
        and critic.megatron[key] != actor.get(key)
        and (key != overrides or critic.megatron[key])
    ]


def check_config(cfg: Any) -> list[str]:
    """The Megatron engine's rules for the composed run config (selected as training engine)."""
    arr = cfg.actor_rollout_ref
    actor, ref = arr.actor, arr.ref
    problems = [p for p in [dtype_problem(arr.model)] if p]
    problems += actor_ref_problems(actor, ref)
    problems += [
        f"{ACTOR}.fsdp_config.{key}=true configures the FSDP engine; strategy=megatron keeps "
        f"weights and optimizer state on the GPU unless {MEGATRON}.param_offload / "
        f"optimizer_offload say otherwise (set it to false)"
        for key in ("param_offload", "optimizer_offload")
        if bool(getattr(actor.fsdp_config, key))
    ]
    for node, megatron in ((MEGATRON, actor.megatron), (REF_MEGATRON, ref.megatron)):
        given = OmegaConf.to_container(megatron.override_transformer_config, resolve=True)
        where = f"{node}.override_transformer_config"
        problems += split(given, where)[1]
        problems += uneven_stage_problems(given, megatron.pipeline_model_parallel_size, where)
        problems += dist_checkpoint_problems(megatron, node)
    problems += _critic_problems(cfg)
    problems += lora_problems(arr.model.lora)
    problems += optimizer_override_lines(actor.optim.override_optimizer_config)[0]
    problems += router_replay_problems(actor.router_replay)
    sizes = parallel_problems(actor.megatron)
    if not sizes:  # the reference's sizes follow the actor's unless set
        sizes = parallel_problems(ref.megatron, REF_MEGATRON)
    return problems + (sizes or _world_problems(cfg))
