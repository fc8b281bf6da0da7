"""LoRA on the actor: what ``actor_rollout_ref.model.lora_rank`` and its sibling keys mean for a
run.

Light on purpose (no torch, no peft): ``polyrl validate``, the run banner, the roles and the
training engines read the same rules from here.

The keys themselves are not core's: the training engines declare them (the engine kit's section,
``polyrl_engine_kit.settings``), so they are typed, shown by ``polyrl config`` and spell-checked
whenever such an engine is installed. Where no installed plugin declares them, the rank reads
as 0 (LoRA off) and the other keys are not read.

With ``lora_rank > 0`` the actor trains low-rank adapters on frozen base weights, and:

- the reference policy is the actor's own model with its adapters switched off (no second copy
  of the weights), so the ``ref`` role must live in the actor's pool;
- weight sync sends what the rollout engine can load (:func:`sync_sends_adapters`): the
  adapters alone to an engine whose plugin declares ``supports_lora_adapters``, else merged
  weights ``W + lora_alpha / lora_rank * B @ A`` under the base model's Hugging Face names;
- checkpoints hold the adapters and their optimizer state only; the HF export is the adapter
  folder (plus the merged model with ``export_merged_lora``).
"""

from __future__ import annotations

import math
from typing import Any

MODEL = "actor_rollout_ref.model"
ALL_LINEAR = "all-linear"


def lora_rank(model: Any) -> int:
    """``lora_rank`` of the ``actor_rollout_ref.model`` node (0: LoRA off, or no installed
    plugin declares the key)."""
    return int(declared_rank(model))


def declared_rank(model: Any) -> Any:
    """``lora_rank`` of the ``actor_rollout_ref.model`` node as set, unchecked; 0 where no
    installed plugin declares it."""
    try:
        rank = model.lora_rank
    except AttributeError:  # omegaconf's ConfigAttributeError: not in this schema
        return 0
    return 0 if rank is None else rank


def lora_problems(model: Any) -> list[str]:
    """One line per bad LoRA key of the ``actor_rollout_ref.model`` node ``model``."""
    rank = declared_rank(model)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        return [f"{MODEL}.lora_rank={rank!r} must be an integer >= 0 (0: LoRA off), e.g. 8"]
    if rank == 0:
        return []
    problems = []
    alpha = model.lora_alpha
    if not _number(alpha) or not math.isfinite(alpha) or alpha <= 0:
        problems.append(f"{MODEL}.lora_alpha={alpha!r} must be a number > 0, e.g. 16")
    dropout = model.lora_dropout
    if not _number(dropout) or not 0 <= dropout < 1:
        problems.append(f"{MODEL}.lora_dropout={dropout!r} must be in [0, 1), e.g. 0.0")
    if target_modules(model) is None:
        problems.append(
            f"{MODEL}.target_modules={_plain(model.target_modules)!r} must be {ALL_LINEAR} or a "
            f"non-empty list of module names, e.g. [q_proj,k_proj,v_proj,o_proj]"
        )
    return problems


def target_modules(model: Any) -> str | list[str] | None:
    """``target_modules`` as peft takes it (``"all-linear"`` or a list of names); None when it
    is neither."""
    value = _plain(model.target_modules)
    if value == ALL_LINEAR:
        return ALL_LINEAR
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) and v for v in value):
        return list(value)
    return None


def sync_sends_adapters(rollout_spec: Any) -> bool:
    """Whether weight sync sends the adapters alone (the rollout plugin's spec declares
    ``supports_lora_adapters``) rather than merged weights."""
    return bool(getattr(rollout_spec, "supports_lora_adapters", False))


def describe_lora(cfg: Any, registry: Any = None) -> str | None:
    """The line ``polyrl validate`` and the run banner print for a LoRA run of the checked
    config ``cfg`` (None with LoRA off)."""
    from polyrl.registry import get_registry
    from polyrl.specs import PluginKind

    model = cfg.actor_rollout_ref.model
    if lora_rank(model) == 0:
        return None
    targets = target_modules(model)
    shown = targets if isinstance(targets, str) else ",".join(targets or ["?"])
    rollout = str(cfg.actor_rollout_ref.rollout.name)
    spec = (registry or get_registry()).get(PluginKind.ROLLOUT_ENGINE, rollout).spec
    sync = (
        "the adapters"
        if sync_sends_adapters(spec)
        else f"merged weights (rollout {rollout!r} takes no adapters)"
    )
    return (
        f"LoRA: rank {model.lora_rank}, alpha {model.lora_alpha}, targets {shown}, dropout "
        f"{model.lora_dropout}; reference = the actor's model with adapters disabled (no second "
        f"copy); weight sync sends {sync}; checkpoints hold the adapters only"
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value
