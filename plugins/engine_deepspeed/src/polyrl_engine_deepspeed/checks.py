"""The DeepSpeed engine's rules for a run config (``TrainingEngineSpec.config_check``).

Light on purpose (no torch, no deepspeed): ``polyrl validate`` imports it. The engine-neutral
rules (micro-batch keys, AdamW betas) are polyrl-engine-fsdp's pure helpers, so both engines
word them alike; core checks the rest (lr ranges, batch arithmetic, device support).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from polyrl_engine_deepspeed.settings import SECTION, DeepSpeedSettings, settings_problems
from polyrl_engine_kit.checks import DTYPES, actor_ref_problems, dtype_name

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"


def dtype_problem(model: Any) -> str | None:
    if dtype_name(model) in DTYPES:
        return None
    return (
        f"actor_rollout_ref.model.dtype={dtype_name(model)!r} is not a dtype the DeepSpeed engine "
        f"knows; use bfloat16 (bf16 weights, fp32 master copy in the optimizer), float16 (with "
        f"dynamic loss scaling) or float32"
    )


def fsdp_keys_problems(node: Any, prefix: str) -> list[str]:
    """verl's FSDP offload switches do nothing under DeepSpeed: say where its own ones are."""
    fsdp = OmegaConf.select(node, "fsdp_config")
    if fsdp is None:  # the FSDP engine is not installed: nothing of it to be set
        return []
    return [
        f"{prefix}.fsdp_config.{key}=true configures the FSDP engine, not strategy=deepspeed; "
        f"use plugins.{SECTION}.{target}=true instead"
        for key, target in (
            ("param_offload", "offload_param"),
            ("optimizer_offload", "offload_optimizer"),
        )
        if bool(getattr(fsdp, key))
    ]


def check_config(cfg: Any) -> list[str]:
    """The DeepSpeed engine's rules for the composed run config (selected as training engine)."""
    arr = cfg.actor_rollout_ref
    actor, ref = arr.actor, arr.ref
    problems = [p for p in [dtype_problem(arr.model)] if p]
    problems += actor_ref_problems(actor, ref, sum_pi_squared=True)
    problems += fsdp_keys_problems(actor, ACTOR)
    return problems + settings_problems(_known_settings(cfg))


def _known_settings(cfg: Any) -> DeepSpeedSettings:
    """``plugins.deepspeed`` without the keys it does not declare (core's check of the spec's
    ``config_class`` reports those), so that the other keys are still checked."""
    section = cfg.plugins.get(SECTION) if cfg.plugins is not None else None
    if isinstance(section, DictConfig):
        section = OmegaConf.to_container(section, resolve=True)
    if not isinstance(section, dict):
        return DeepSpeedSettings()
    known = {f.name for f in fields(DeepSpeedSettings)}
    return DeepSpeedSettings(**{key: value for key, value in section.items() if key in known})
