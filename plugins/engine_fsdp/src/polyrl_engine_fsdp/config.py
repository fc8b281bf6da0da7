"""The settings the engine reads from polyrl's config, resolved once into plain dataclasses.

The engine receives config nodes (OmegaConf ``DictConfig`` from Hydra, or plain dicts and objects
in tests). Reading every key through :func:`cfg_get` in one place means the engine code works on
typed values and a wrong value is reported with the full config key that holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polyrl.errors import ConfigError

_MISSING = object()

DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


def cfg_get(node: Any, key: str, default: Any = None) -> Any:
    """``node.key`` for a DictConfig, dict or object; ``default`` when absent or ``None``."""
    if node is None:
        return default
    value: Any = _MISSING
    if isinstance(node, Mapping) or hasattr(node, "get"):
        try:
            value = node.get(key, _MISSING)
        except Exception:  # noqa: BLE001 - struct DictConfigs raise on unknown keys
            value = _MISSING
    if value is _MISSING:
        try:
            value = getattr(node, key)
        except Exception:  # noqa: BLE001 - attribute errors of any config flavour
            value = _MISSING
    return default if value is _MISSING or value is None else value


def to_plain(node: Any) -> Any:
    """A plain ``dict``/``list`` copy of a config node (for ``override_config``)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, DictConfig | ListConfig):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:  # omegaconf is a core dependency, but tests may pass dicts only
        pass
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
class EngineSettings:
    """Everything the engine needs from ``actor_rollout_ref.model`` and the role's node."""

    dtype: str
    mixed_precision: bool
    reshard_after_forward: bool
    param_offload: bool
    gradient_checkpointing: bool
    override_config: dict[str, Any]
    trust_remote_code: bool
    tokenizer_path: str | None
    micro_batch_size: int
    log_prob_micro_batch_size: int
    use_dynamic_bsz: bool
    max_token_len: int
    log_prob_max_token_len: int
    entropy_coeff: float
    optim: OptimSettings


def _positive_int(value: Any, key: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number <= 0:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return number


def resolve_settings(
    model: Any,
    engine: Any,
    total_training_steps: int,
    role: str = "actor",
    world_size: int | None = None,
) -> EngineSettings:
    """Read and check the keys the engine uses (see the package README for the list).

    ``total_optimizer_steps`` (optional key on the role node) is the number of optimizer steps
    the LR schedule spans: the controller knows it (training steps x mini-batches x epochs);
    without it the schedule spans ``total_training_steps`` (right when one mini-batch per step).
    """
    prefix = "critic" if role == "critic" else "actor_rollout_ref.actor"
    dtype_name = str(cfg_get(model, "dtype", "bfloat16")).lower().replace("torch.", "")
    if dtype_name not in DTYPES:
        raise ConfigError(
            f"actor_rollout_ref.model.dtype={dtype_name!r} is not a dtype the FSDP engine knows; "
            f"use one of bfloat16, float16, float32"
        )
    fsdp = cfg_get(engine, "fsdp_config", {})
    optim = cfg_get(engine, "optim", {})

    micro = _positive_int(
        cfg_get(engine, "ppo_micro_batch_size_per_gpu", 1), f"{prefix}.ppo_micro_batch_size_per_gpu"
    )
    log_prob_micro = _positive_int(
        cfg_get(engine, "log_prob_micro_batch_size_per_gpu", micro),
        f"{prefix}.log_prob_micro_batch_size_per_gpu",
    )
    max_tokens = _positive_int(
        cfg_get(engine, "ppo_max_token_len_per_gpu", 16384), f"{prefix}.ppo_max_token_len_per_gpu"
    )
    log_prob_max_tokens = _positive_int(
        cfg_get(engine, "log_prob_max_token_len_per_gpu", max_tokens),
        f"{prefix}.log_prob_max_token_len_per_gpu",
    )

    total_steps = int(cfg_get(engine, "total_optimizer_steps", 0) or total_training_steps or 1)
    total_steps = max(total_steps, 1)
    warmup = int(cfg_get(optim, "lr_warmup_steps", -1))
    if warmup < 0:
        ratio = float(cfg_get(optim, "lr_warmup_steps_ratio", 0.0))
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(
                f"{prefix}.optim.lr_warmup_steps_ratio must be in [0, 1], got {ratio}"
            )
        warmup = int(ratio * total_steps)
    style = str(cfg_get(optim, "lr_scheduler_type", cfg_get(optim, "warmup_style", "constant")))
    if style not in ("constant", "cosine"):
        raise ConfigError(
            f"{prefix}.optim.warmup_style={style!r} is unknown; use 'constant' or 'cosine'"
        )
    betas = tuple(float(b) for b in cfg_get(optim, "betas", (0.9, 0.999)))
    if len(betas) != 2:
        raise ConfigError(f"{prefix}.optim.betas must hold two numbers, got {list(betas)}")
    lr = float(cfg_get(optim, "lr", 1e-6))
    if lr < 0:
        raise ConfigError(f"{prefix}.optim.lr must be >= 0, got {lr}")
    min_lr_ratio = float(cfg_get(optim, "min_lr_ratio", 0.0))
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ConfigError(f"{prefix}.optim.min_lr_ratio must be in [0, 1], got {min_lr_ratio}")

    fsdp_size = int(cfg_get(fsdp, "fsdp_size", -1))
    if fsdp_size > 0 and world_size is not None and fsdp_size != world_size:
        raise ConfigError(
            f"{prefix}.fsdp_config.fsdp_size={fsdp_size} asks for hybrid sharding (HSDP), which "
            f"the FSDP engine does not implement; leave it at -1 to shard over all "
            f"{world_size} ranks"
        )
    override = to_plain(cfg_get(model, "override_config", {})) or {}
    if not isinstance(override, dict):
        raise ConfigError(
            f"actor_rollout_ref.model.override_config must be a mapping of HF config keys, "
            f"got {override!r}"
        )
    return EngineSettings(
        dtype=DTYPES[dtype_name],
        mixed_precision=bool(cfg_get(fsdp, "mixed_precision", True)),
        reshard_after_forward=bool(cfg_get(fsdp, "reshard_after_forward", True)),
        # FSDP2's CPUOffloadPolicy moves parameters, gradients and the optimizer step to the
        # CPU together, so either key turns it on.
        param_offload=bool(cfg_get(fsdp, "param_offload", False))
        or bool(cfg_get(fsdp, "optimizer_offload", False)),
        gradient_checkpointing=bool(cfg_get(model, "enable_gradient_checkpointing", False)),
        override_config=override,
        trust_remote_code=bool(cfg_get(model, "trust_remote_code", False)),
        tokenizer_path=cfg_get(model, "tokenizer_path", None),
        micro_batch_size=micro,
        log_prob_micro_batch_size=log_prob_micro,
        use_dynamic_bsz=bool(cfg_get(engine, "use_dynamic_bsz", False)),
        max_token_len=max_tokens,
        log_prob_max_token_len=log_prob_max_tokens,
        entropy_coeff=float(cfg_get(engine, "entropy_coeff", 0.0)),
        optim=OptimSettings(
            lr=lr,
            betas=(betas[0], betas[1]),
            weight_decay=float(cfg_get(optim, "weight_decay", 0.01)),
            clip_grad=float(cfg_get(optim, "clip_grad", 1.0)),
            warmup_steps=warmup,
            warmup_style=style,
            min_lr_ratio=min_lr_ratio,
            total_steps=total_steps,
        ),
    )
