"""The settings the engine reads from polyrl's config, resolved once into plain dataclasses.

The engine receives config nodes (see :class:`polyrl.interfaces.EngineContext`): ``model`` is
``actor_rollout_ref.model`` and ``engine`` the role's node, shaped like
``actor_rollout_ref.actor`` (the reference's is the actor's with ``actor_rollout_ref.ref`` merged
over it). Keys are read as attributes; every default comes from :mod:`polyrl.config.schema`
(a plain or partial dict is first merged over the schema's node by
:func:`polyrl.config.nodes.schema_node`). A wrong value is reported with the full config key
that holds it (the same lines as ``polyrl validate``, from :mod:`polyrl_engine_kit.checks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from polyrl.api import ConfigError, adapter_path, lora_config, lora_rank, schema_node
from polyrl_engine_kit.checks import (
    AUTO_SWITCH,
    DTYPES,
    dtype_name,
    node_problems,
    precision_name,
    scheduler_type,
)

# Not a config key: the hybrid worker adds it to the engine node (training steps x mini-batches
# x epochs), the number of optimizer steps the LR schedule spans.
TOTAL_OPTIMIZER_STEPS = "total_optimizer_steps"


def to_plain(node: Any) -> Any:
    """A plain ``dict``/``list`` copy of a config node (for ``override_config``)."""
    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=True)
    if isinstance(node, Mapping):
        return {k: to_plain(v) for k, v in node.items()}
    return node


@dataclass(frozen=True)
class OptimSettings:
    """``<role>.optim``: AdamW and the LR schedule."""

    lr: float
    betas: tuple[float, float]
    weight_decay: float
    clip_grad: float
    warmup_steps: int
    warmup_style: str
    min_lr_ratio: float
    total_steps: int


@dataclass(frozen=True)
class LoraSettings:
    """``actor_rollout_ref.model.lora_rank`` and its siblings: a LoRA actor's adapters (see
    :mod:`.lora`); with ``adapter_path`` (verl's ``lora_adapter_path``) the saved adapter's
    settings, and its weights to start from."""

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...]  # "all-linear", a saved adapter's regex, or names
    dropout: float
    export_merged: bool
    exclude_modules: str | tuple[str, ...] | None = None  # a regex or names; None: none
    adapter_path: str | None = None


def lora_settings(model: Any) -> LoraSettings | None:
    """The LoRA settings of a checked ``actor_rollout_ref.model`` node; None with LoRA off."""
    if lora_rank(model) == 0:
        return None
    config = lora_config(model)
    targets, excluded = config["target_modules"], config["exclude_modules"]
    return LoraSettings(
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        target_modules=targets if isinstance(targets, str) else tuple(targets or ()),
        dropout=float(config["lora_dropout"]),
        export_merged=bool(model.export_merged_lora),
        exclude_modules=excluded if isinstance(excluded, str | None) else tuple(excluded),
        adapter_path=adapter_path(model),
    )


@dataclass(frozen=True)
class EngineSettings:
    """Everything the engine needs from ``actor_rollout_ref.model`` and the role's node."""

    dtype: str
    mixed_precision: bool
    reshard_after_forward: bool
    param_offload: bool
    gradient_checkpointing: bool
    remove_padding: bool  # pack each micro-batch into one row (packing.py)
    use_liger: bool  # Liger's RoPE/RMSNorm/SwiGLU kernels where available (liger.py)
    fused_log_prob: bool  # log-probs from hidden states, no fp32 logits (fused_logprob.py)
    torch_compile: bool  # decoder layers and fused log-probs compiled on CUDA (compiling.py)
    accumulate_unsharded: bool | None  # None: auto (modeling.accumulates_unsharded)
    override_config: dict[str, Any]
    trust_remote_code: bool
    tokenizer_path: str | None
    micro_batch_size: int
    log_prob_micro_batch_size: int
    use_dynamic_bsz: bool
    max_token_len: int
    log_prob_max_token_len: int
    optim: OptimSettings
    lora: LoraSettings | None = None  # None: full fine-tuning
    # FSDP's shard group size (verl's fsdp_size): <= 0 or the world shards over all ranks, a
    # divisor of the world below it gives hybrid sharding (modeling.shard_model)
    fsdp_size: int = -1
    # FSDP's precision (verl's fsdp_config.model_dtype and mixed_precision.*, see
    # polyrl_engine_fsdp.modeling.precision_policy): the dtype the master weights are created
    # in, and the MixedPrecisionPolicy's dtypes (None: what mixed_precision implies)
    master_dtype: str = "float32"
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    buffer_dtype: str | None = None
    # verl's custom_chat_template: written into HF exports so they render chats as the run did
    chat_template: str | None = None


def _split_runtime_keys(engine: Any) -> tuple[Any, int | None]:
    """The engine node without :data:`TOTAL_OPTIMIZER_STEPS`, and that value (None if absent).
    A ``DictConfig`` keeps the key (it is not merged over the schema, so it does no harm)."""
    if isinstance(engine, DictConfig):
        return engine, engine.get(TOTAL_OPTIMIZER_STEPS)
    if isinstance(engine, Mapping):
        plain = dict(engine)
        return plain, plain.pop(TOTAL_OPTIMIZER_STEPS, None)
    return engine, None


def engine_node(engine: Any) -> Any:
    """A role's engine node merged over the schema's ``actor_rollout_ref.actor`` (without the
    runtime key :data:`TOTAL_OPTIMIZER_STEPS`): where an engine reads the keys its own plugin
    declares there."""
    return schema_node(_split_runtime_keys(engine)[0], "actor_rollout_ref.actor")


def resolve_settings(
    model: Any,
    engine: Any,
    total_training_steps: int,
    role: str = "actor",
    world_size: int | None = None,
) -> EngineSettings:
    """Read and check the keys the engine uses (see the package README for the list).

    The LR schedule spans the engine node's ``total_optimizer_steps`` when the controller put it
    there (training steps x mini-batches x epochs), else ``total_training_steps`` (right when
    there is one mini-batch per step).
    """
    prefix = "critic" if role == "critic" else "actor_rollout_ref.actor"
    engine, optimizer_steps = _split_runtime_keys(engine)
    model = schema_node(model, "actor_rollout_ref.model")
    engine = schema_node(engine, "actor_rollout_ref.actor")
    problems = node_problems(model, engine, prefix, world_size)
    override = to_plain(model.override_config)
    if not isinstance(override, dict):
        problems.append(
            f"actor_rollout_ref.model.override_config must be a mapping of HF config keys, "
            f"got {override!r}"
        )
    if problems:
        raise ConfigError("; ".join(problems))

    fsdp, optim = engine.fsdp_config, engine.optim
    total_steps = max(int(optimizer_steps or total_training_steps or 1), 1)
    warmup = int(optim.lr_warmup_steps)
    if warmup < 0:
        warmup = int(float(optim.lr_warmup_steps_ratio) * total_steps)
    betas = [float(b) for b in optim.betas]
    return EngineSettings(
        dtype=DTYPES[dtype_name(model)],
        mixed_precision=bool(fsdp.mixed_precision),
        reshard_after_forward=bool(fsdp.reshard_after_forward),
        # FSDP2's CPUOffloadPolicy moves parameters, gradients and the optimizer step to the
        # CPU together, so either key turns it on (polyrl validate notes it when they differ).
        param_offload=bool(fsdp.param_offload) or bool(fsdp.optimizer_offload),
        gradient_checkpointing=bool(model.enable_gradient_checkpointing),
        remove_padding=bool(model.use_remove_padding),
        use_liger=bool(model.use_liger),
        fused_log_prob=bool(model.use_fused_kernels),
        torch_compile=bool(engine.use_torch_compile),
        accumulate_unsharded=AUTO_SWITCH[fsdp.accumulate_unsharded],
        override_config=override,
        trust_remote_code=bool(model.trust_remote_code),
        tokenizer_path=model.tokenizer_path,
        micro_batch_size=int(engine.ppo_micro_batch_size_per_gpu),
        log_prob_micro_batch_size=int(engine.log_prob_micro_batch_size_per_gpu),
        use_dynamic_bsz=bool(engine.use_dynamic_bsz),
        max_token_len=int(engine.ppo_max_token_len_per_gpu),
        log_prob_max_token_len=int(engine.log_prob_max_token_len_per_gpu),
        optim=OptimSettings(
            lr=float(optim.lr),
            betas=(betas[0], betas[1]),
            weight_decay=float(optim.weight_decay),
            clip_grad=float(optim.clip_grad),
            warmup_steps=warmup,
            warmup_style=scheduler_type(optim),
            min_lr_ratio=float(optim.min_lr_ratio),
            total_steps=total_steps,
        ),
        lora=lora_settings(model),
        fsdp_size=int(fsdp.fsdp_size),
        master_dtype=DTYPES[precision_name(fsdp.model_dtype)],
        param_dtype=_optional_dtype(fsdp.param_dtype),
        reduce_dtype=_optional_dtype(fsdp.reduce_dtype),
        buffer_dtype=_optional_dtype(fsdp.buffer_dtype),
        chat_template=model.custom_chat_template,
    )


def _optional_dtype(value: Any) -> str | None:
    """A checked dtype key's canonical name; None where it is unset."""
    return None if value is None else DTYPES[precision_name(value)]
