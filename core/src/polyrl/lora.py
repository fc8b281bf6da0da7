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

import json
import math
import os
from typing import Any

from polyrl.errors import ConfigError

MODEL = "actor_rollout_ref.model"
ALL_LINEAR = "all-linear"
ADAPTER_KEY = f"{MODEL}.lora_adapter_path"
ADAPTER_CONFIG = "adapter_config.json"  # peft's saved LoraConfig in an adapter folder


def lora_rank(model: Any) -> int:
    """The LoRA rank of the ``actor_rollout_ref.model`` node: ``lora_rank``, or the saved
    adapter's ``r`` with ``lora_adapter_path`` (0: LoRA off, or no installed plugin declares
    the keys)."""
    return int(declared_rank(model))


def declared_rank(model: Any) -> Any:
    """The LoRA rank of the ``actor_rollout_ref.model`` node as set, unchecked: with
    ``lora_adapter_path`` the saved adapter's ``r`` (0 where the adapter cannot be read:
    :func:`lora_problems` says why), else ``lora_rank``; 0 where no installed plugin declares
    it."""
    path = adapter_path(model)
    if path is not None:
        try:
            return saved_adapter(path).get("r", 0)
        except ConfigError:
            return 0
    try:
        rank = model.lora_rank
    except AttributeError:  # omegaconf's ConfigAttributeError: not in this schema
        return 0
    return 0 if rank is None else rank


def adapter_path(model: Any) -> str | None:
    """verl's ``lora_adapter_path`` (a saved peft adapter folder to start LoRA from), ``~``
    expanded; None where unset or not declared."""
    try:
        path = model.lora_adapter_path
    except AttributeError:
        return None
    return None if path in (None, "") else os.path.expanduser(str(path))


def saved_adapter(path: str) -> dict[str, Any]:
    """peft's ``adapter_config.json`` of the adapter folder ``path`` (a LoRA adapter's); a
    :class:`ConfigError` in one line when it is missing or not a LoRA adapter's."""
    file = os.path.join(path, ADAPTER_CONFIG)
    try:
        with open(file) as handle:
            saved = json.load(handle)
    except FileNotFoundError:
        raise ConfigError(
            f"{ADAPTER_KEY}={path!r} has no {ADAPTER_CONFIG}: give a folder saved by peft "
            f"(save_pretrained of a LoRA model, or polyrl's LoRA export)"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{ADAPTER_KEY}: {file} cannot be read ({exc})") from None
    if not isinstance(saved, dict) or saved.get("peft_type", "LORA") != "LORA":
        kind = saved.get("peft_type") if isinstance(saved, dict) else type(saved).__name__
        raise ConfigError(
            f"{ADAPTER_KEY}={path!r} holds a {kind} adapter, not a LoRA one; give a LoRA "
            f"adapter folder"
        )
    return saved


def lora_config(model: Any) -> dict[str, Any]:
    """The actor's LoRA settings as peft's ``LoraConfig`` names them (``r``, ``lora_alpha``,
    ``lora_dropout``, ``target_modules``, ``exclude_modules``), unchecked. Why one place: with
    ``lora_adapter_path`` the saved adapter brings its own (its ``adapter_config.json``, as
    verl's ``PeftModel.from_pretrained`` uses), and every reader (validation, the banner, the
    engines) must see the same values."""
    path = adapter_path(model)
    if path is not None:
        saved = saved_adapter(path)
        return {
            "r": saved.get("r"),
            "lora_alpha": saved.get("lora_alpha"),
            "lora_dropout": saved.get("lora_dropout", 0.0),
            "target_modules": _targets(saved.get("target_modules"), saved=True),
            "exclude_modules": _exclusions(saved.get("exclude_modules")),
        }
    return {
        "r": declared_rank(model),
        "lora_alpha": model.lora_alpha,
        "lora_dropout": model.lora_dropout,
        "target_modules": target_modules(model),
        "exclude_modules": _exclusions(_plain(model.exclude_modules)),
    }


def lora_problems(model: Any) -> list[str]:
    """One line per bad LoRA key of the ``actor_rollout_ref.model`` node ``model`` (or of the
    saved adapter that ``lora_adapter_path`` names)."""
    path = adapter_path(model)
    if path is not None:
        return _adapter_problems(model, path)
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
    excluded = _plain(model.exclude_modules)
    if excluded is not None and _exclusions(excluded) is None:
        problems.append(
            f"{MODEL}.exclude_modules={excluded!r} must be a regex (peft matches it against "
            f"each module's full name) or a non-empty list of module names, e.g. [lm_head]"
        )
    return problems


def _adapter_problems(model: Any, path: str) -> list[str]:
    """A saved adapter to start from: readable, with a usable rank, alpha and targets; a
    ``lora_rank`` set beside it must be the adapter's."""
    try:
        saved = lora_config(model)
    except ConfigError as exc:
        return [str(exc)]
    where = f"the adapter {path}/{ADAPTER_CONFIG}"
    problems = []
    rank, alpha = saved["r"], saved["lora_alpha"]
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        problems.append(f"{where} has r={rank!r}; a LoRA adapter's rank is an integer > 0")
    if not _number(alpha) or not math.isfinite(alpha) or alpha <= 0:
        problems.append(f"{where} has lora_alpha={alpha!r}; it must be a number > 0")
    if saved["target_modules"] is None:
        problems.append(f"{where} names no target_modules")
    try:
        own = model.lora_rank
    except AttributeError:
        own = 0
    if own not in (0, None, rank):
        problems.append(
            f"{MODEL}.lora_rank={own} differs from the rank {rank} of {ADAPTER_KEY}={path!r}; "
            f"the adapter's settings are used (as in verl): drop lora_rank or set it to {rank}"
        )
    return problems


def target_modules(model: Any) -> str | list[str] | None:
    """``target_modules`` as peft takes it (``"all-linear"`` or a list of names); None when it
    is neither."""
    return _targets(_plain(model.target_modules))


def _targets(value: Any, saved: bool = False) -> str | list[str] | None:
    """Target modules as peft takes them; a string other than ``all-linear`` is one module name
    on the command line, but peft's regex in a saved adapter (``saved``)."""
    if value == ALL_LINEAR or (saved and isinstance(value, str) and value):
        return value
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) and v for v in value):
        return list(value)
    return None


def _exclusions(value: Any) -> str | list[str] | None:
    """verl's ``exclude_modules`` as peft takes it: a regex string or a list of module names;
    None when unset (or unusable: :func:`lora_problems` says so)."""
    if isinstance(value, str) and value:
        return value
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
    config = lora_config(model)
    targets = config["target_modules"]
    shown = targets if isinstance(targets, str) else ",".join(targets or ["?"])
    excluded = config["exclude_modules"]
    if excluded:
        shown += f" except {excluded if isinstance(excluded, str) else ','.join(excluded)}"
    path = adapter_path(model)
    start = f" from the adapter {path}" if path else ""
    rollout = str(cfg.actor_rollout_ref.rollout.name)
    spec = (registry or get_registry()).get(PluginKind.ROLLOUT_ENGINE, rollout).spec
    sync = (
        "the adapters"
        if sync_sends_adapters(spec)
        else f"merged weights (rollout {rollout!r} takes no adapters)"
    )
    return (
        f"LoRA{start}: rank {config['r']}, alpha {config['lora_alpha']}, targets {shown}, "
        f"dropout {config['lora_dropout']}; reference = the actor's model with adapters "
        f"disabled (no second copy); weight sync sends {sync}; checkpoints hold the adapters only"
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value
