"""Rules for the engine keys that every engine reads from verl's ``actor_rollout_ref`` nodes.

Light on purpose (no torch): the engines' ``config_check`` functions, which ``polyrl validate``
imports, are built from them. :func:`node_problems` is shared with
:func:`polyrl_engine_kit.config.resolve_settings`, which raises the same lines at run time for
an engine built outside a validated run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from polyrl.api import lora_problems

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
CRITIC = "critic"
# verl's key for Ulysses sequence parallelism, declared by polyrl-engine-fsdp on each role
ULYSSES = "ulysses_sequence_parallel_size"
# verl's switch for the old log-prob pass's sum_pi_squared, declared by core
SUM_PI_SQUARED = "calculate_sum_pi_squared"

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
LR_SCHEDULER_TYPES = ("constant", "cosine")
# fsdp_config.accumulate_unsharded: its values (None: the engine decides from the model's size)
AUTO_SWITCH = {"auto": None, True: True, False: False, "true": True, "false": False}


def dtype_name(model: Any) -> str:
    return str(model.dtype).lower().replace("torch.", "")


def dtype_problem(model: Any) -> str | None:
    name = dtype_name(model)
    if name in DTYPES:
        return None
    return (
        f"actor_rollout_ref.model.dtype={name!r} is not a dtype the engines know; "
        f"use one of bfloat16, float16, float32"
    )


def scheduler_type(optim: Any) -> str:
    """``optim.lr_scheduler_type``, or verl's older ``warmup_style`` when that is set."""
    return str(optim.warmup_style if optim.warmup_style is not None else optim.lr_scheduler_type)


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def batch_problems(node: Any, prefix: str, keys: tuple[str, ...]) -> list[str]:
    """``keys`` of ``node`` that are not positive integers."""
    return [
        f"{prefix}.{key} must be a positive integer, got {getattr(node, key)!r}"
        for key in keys
        if not positive_int(getattr(node, key))
    ]


def optim_problems(optim: Any, prefix: str, *, core_checked: bool = False) -> list[str]:
    """AdamW and the LR schedule. ``core_checked``: skip what ``polyrl validate`` checks for
    every engine (lr, warm-up ratio, min_lr_ratio, the scheduler name)."""
    problems = []
    if not core_checked:
        if float(optim.lr) < 0:
            problems.append(f"{prefix}.optim.lr must be >= 0, got {optim.lr}")
        if not 0.0 <= float(optim.lr_warmup_steps_ratio) <= 1.0:
            problems.append(
                f"{prefix}.optim.lr_warmup_steps_ratio must be in [0, 1], got "
                f"{optim.lr_warmup_steps_ratio}"
            )
        if not 0.0 <= float(optim.min_lr_ratio) <= 1.0:
            problems.append(
                f"{prefix}.optim.min_lr_ratio must be in [0, 1], got {optim.min_lr_ratio}"
            )
        style = scheduler_type(optim)
        if style not in LR_SCHEDULER_TYPES:
            key = "warmup_style" if optim.warmup_style is not None else "lr_scheduler_type"
            problems.append(
                f"{prefix}.optim.{key}={style!r} is unknown; use 'constant' or 'cosine'"
            )
    if len(list(optim.betas)) != 2:
        problems.append(f"{prefix}.optim.betas must hold two numbers, got {list(optim.betas)}")
    return problems


def fsdp_size_problem(
    fsdp: Any, prefix: str, world_size: int | None, where: str | None = None
) -> str | None:
    """verl's ``fsdp_size``: -1 (or 0, or the world size) shards over all ranks; a size between
    shards within groups of that many ranks and replicates across the groups (hybrid sharding,
    HSDP), so it must divide the role's ranks."""
    size = int(fsdp.fsdp_size)
    if size <= 0 or world_size is None or (size <= world_size and world_size % size == 0):
        return None
    detail = f" ({where})" if where else ""
    return (
        f"{prefix}.fsdp_config.fsdp_size={size} does not divide the {world_size} ranks{detail}: "
        f"hybrid sharding shards within groups of fsdp_size ranks; use a divisor of "
        f"{world_size}, or -1 to shard over all of them"
    )


# verl's FSDP precision keys (fsdp_config.model_dtype and mixed_precision.*, which the FSDP
# engine declares as fsdp_config.{model_dtype, param_dtype, reduce_dtype, buffer_dtype}); only
# model_dtype is always set.
PRECISION_KEYS = ("model_dtype", "param_dtype", "reduce_dtype", "buffer_dtype")


def precision_name(value: Any) -> str:
    """A precision key's value as :data:`DTYPES` spells it (``torch.bfloat16`` -> ``bfloat16``;
    verl's ``bf16`` and ``fp32`` are keys of it already)."""
    return str(value).lower().replace("torch.", "")


def precision_problems(fsdp: Any, prefix: str) -> list[str]:
    """verl's FSDP dtypes: each set one must be a dtype the engines know."""
    problems = []
    for key in PRECISION_KEYS:
        value = getattr(fsdp, key, None)
        if value is None and key != "model_dtype":
            continue
        if precision_name(value) not in DTYPES:
            problems.append(
                f"{prefix}.fsdp_config.{key}={value!r} is not a dtype the engines know; use "
                f"bfloat16 (bf16), float16 (fp16) or float32 (fp32)"
            )
    return problems


def switch_problem(fsdp: Any, prefix: str) -> str | None:
    value = fsdp.accumulate_unsharded
    if not (isinstance(value, bool | str) and value in AUTO_SWITCH):
        key = f"{prefix}.fsdp_config.accumulate_unsharded"
        return f"{key}={value!r} is not one of auto, true, false"
    offload = bool(fsdp.param_offload) or bool(fsdp.optimizer_offload)
    if AUTO_SWITCH[value] and offload:
        return (
            f"{prefix}.fsdp_config.accumulate_unsharded=true keeps full weights and gradients "
            f"on the GPU, which CPU offload (param_offload / optimizer_offload) is there to "
            f"avoid; set it to auto or false"
        )
    return None


def node_problems(model: Any, engine: Any, prefix: str, world_size: int | None) -> list[str]:
    """Everything :func:`~polyrl_engine_kit.config.resolve_settings` refuses, for the engine
    node ``engine`` of one role (its keys named under ``prefix``)."""
    problems = [p for p in [dtype_problem(model)] if p]
    problems += batch_problems(
        engine,
        prefix,
        (
            "ppo_micro_batch_size_per_gpu",
            "log_prob_micro_batch_size_per_gpu",
            "ppo_max_token_len_per_gpu",
            "log_prob_max_token_len_per_gpu",
        ),
    )
    problems += optim_problems(engine.optim, prefix)
    problems += lora_problems(model)
    size = fsdp_size_problem(engine.fsdp_config, prefix, world_size)
    problems += precision_problems(engine.fsdp_config, prefix)
    switch = switch_problem(engine.fsdp_config, prefix)
    return [*problems, *([size] if size else []), *([switch] if switch else [])]


def actor_ref_problems(
    actor: Any, ref: Any, sequence_parallel: bool = False, sum_pi_squared: bool = False
) -> list[str]:
    """The micro-batch keys of the actor and the reference, and the actor's AdamW, as every
    engine reading verl's ``actor_rollout_ref`` keys checks them. The reference's keys default
    to the actor's: a value it only inherits is reported once. Without ``sequence_parallel``
    (an engine that does not split sequences) a Ulysses size above 1 is refused; without
    ``sum_pi_squared`` (an engine that does not override
    ``TrainingEngine.compute_log_prob_and_sum_pi_squared``), ``calculate_sum_pi_squared``."""
    log_prob = ("log_prob_micro_batch_size_per_gpu", "log_prob_max_token_len_per_gpu")
    problems = batch_problems(actor, ACTOR, ("ppo_max_token_len_per_gpu", *log_prob))
    own = tuple(key for key in log_prob if getattr(ref, key) != getattr(actor, key))
    problems += batch_problems(ref, REF, own)
    if not sequence_parallel:
        unsplit = [unsplit_problem(actor, ACTOR)]
        if unsplit_problem(ref, REF) != unsplit_problem(actor, REF):
            unsplit.append(unsplit_problem(ref, REF))
        problems += [p for p in unsplit if p]
    if not sum_pi_squared and actor.get(SUM_PI_SQUARED) is True:
        problems.append(
            f"{ACTOR}.{SUM_PI_SQUARED}=true: this engine does not compute sum_pi_squared (the "
            f"FSDP and DeepSpeed engines do); use actor_rollout_ref.actor.strategy=fsdp2, or "
            f"set it to false with an estimator that does not read it"
        )
    return problems + optim_problems(actor.optim, ACTOR, core_checked=True)


def unsplit_problem(node: Any, prefix: str) -> str | None:
    """A Ulysses size above 1 for an engine that does not implement it (the key exists where
    polyrl-engine-fsdp is installed)."""
    size = node.get(ULYSSES, 1) if hasattr(node, "get") else 1
    if size == 1:
        return None
    return (
        f"{prefix}.{ULYSSES}={size}: Ulysses sequence parallelism is implemented by the FSDP "
        f"engine only; set it to 1, or use actor_rollout_ref.actor.strategy=fsdp2"
    )


def head_problem(num_heads: int, num_kv_heads: int, size: int, prefix: str) -> str | None:
    """Under Ulysses each rank attends with ``1 / size`` of the query heads and of the
    key/value heads; fewer key/value heads than ranks are repeated to one per rank when
    ``size`` is a multiple of their number."""
    if num_heads % size == 0 and (num_kv_heads % size == 0 or size % num_kv_heads == 0):
        return None
    return (
        f"{prefix}.{ULYSSES}={size} must divide the model's {num_heads} attention heads, and "
        f"divide or be a multiple of its {num_kv_heads} key/value heads (each rank attends "
        f"with a share of both); use such a size"
    )


def model_heads(path: Any) -> tuple[int, int] | None:
    """``(attention heads, key/value heads)`` from the ``config.json`` of a local model folder;
    None for anything else (a hub name: the engine checks the loaded config)."""
    config = Path(str(path)) / "config.json"
    if path is None or not config.is_file():
        return None
    hf = json.loads(config.read_text())
    heads = hf.get("num_attention_heads")
    if not isinstance(heads, int):
        return None
    kv_heads = hf.get("num_key_value_heads")
    return heads, kv_heads if isinstance(kv_heads, int) else heads
