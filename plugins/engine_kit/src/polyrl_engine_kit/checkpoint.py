"""What every engine's checkpoint holds besides its weights, and the Hugging Face export.

Each rank writes ``extra_state_rank_<r>.pt`` beside the engine's shards: the step counter, the
LR schedule and its RNG states (they differ per rank, hence one file each), all tensors and plain
data so the file loads with ``torch.load(weights_only=True)``. An export is a ``save_pretrained``
folder written from a full state dict on rank 0, with the model folder's tokenizer files.
"""

from __future__ import annotations

import os
import random
import shutil
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from polyrl.api import PolyrlError, save_hf_model
from polyrl_engine_kit.config import EngineSettings, resolve_settings
from polyrl_engine_kit.modeling import load_hf_model

EXTRA_STATE = "extra_state_rank_{rank}.pt"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


class CheckpointError(PolyrlError):
    """A checkpoint folder is missing or does not match this engine."""


def rng_state(device: torch.device) -> dict[str, Any]:
    """RNG states as tensors and plain data, so the file loads with ``weights_only=True``."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def loop_state(global_step: int, scheduler: Any, device: torch.device) -> dict[str, Any]:
    """What every engine saves besides weights and optimizer: the step counter, the LR
    schedule and this rank's RNG states (engines add their layout)."""
    return {
        "global_step": global_step,
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "rng": rng_state(device),
    }


def restore_loop_state(extra: dict[str, Any], scheduler: Any, device: torch.device) -> int:
    """Put back what :func:`loop_state` saved; return the step counter."""
    if scheduler is not None and extra.get("scheduler") is not None:
        scheduler.load_state_dict(extra["scheduler"])
    set_rng_state(extra["rng"], device)
    return int(extra["global_step"])


def model_in_one_process(cfg: Any, model_path: str) -> tuple[nn.Module, EngineSettings]:
    """The actor's model as the engine builds it (float32, ``override_config`` applied) on this
    process's CPU, with its settings from ``cfg``, the run config a checkpoint was saved with:
    the skeleton a checkpoint reader (``polyrl export``) loads a checkpoint into."""
    arr = cfg.actor_rollout_ref
    settings = resolve_settings(arr.model, arr.actor, total_training_steps=1)
    return load_hf_model(model_path, settings, torch.device("cpu")), settings


def export_on_rank0(
    path: str,
    state: dict[str, torch.Tensor],
    hf_config: Any,
    dtype: torch.dtype,
    settings: Any,
    model_path: str,
) -> None:
    """On rank 0, ``state`` (whole, on its CPU) as a Hugging Face folder with the tokenizer of
    ``settings.tokenizer_path`` (else ``model_path``); other ranks do nothing (the engine frees
    its copy and then waits at a barrier)."""
    if dist.get_rank() == 0:
        write_hf_folder(
            path,
            state,
            hf_config,
            dtype,
            settings.tokenizer_path or model_path,
            settings.trust_remote_code,
            settings.chat_template,
        )


def write_hf_folder(
    path: str,
    state_dict: dict[str, torch.Tensor],
    hf_config: Any,
    dtype: torch.dtype,
    tokenizer_source: str,
    trust_remote_code: bool = False,
    chat_template: str | None = None,
) -> None:
    """Save ``state_dict`` as a ``save_pretrained`` folder (safetensors) plus tokenizer files
    (with ``chat_template``, the run's custom chat template, see :func:`copy_tokenizer`).

    The weights are placed into a model built on the meta device (no memory, no random init),
    so ``save_pretrained`` sees real tied parameters and writes the layout ``from_pretrained``
    expects.
    """
    from transformers import AutoModelForCausalLM

    os.makedirs(path, exist_ok=True)
    config = type(hf_config).from_dict(hf_config.to_dict())
    config.use_cache = True
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, trust_remote_code=trust_remote_code
        )
    aliases = _alias_names(model)
    weights = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    for alias in aliases:
        weights.pop(alias, None)
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    missing = [k for k in missing if k not in aliases]
    if missing or unexpected:
        raise CheckpointError(
            f"exported weights do not match {type(model).__name__}: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    model.tie_weights()
    save_hf_model(model, path)
    copy_tokenizer(tokenizer_source, path, trust_remote_code, chat_template)


def _alias_names(model: nn.Module) -> set[str]:
    """Names of parameters that are the same object as an earlier one (tied weights)."""
    seen: set[int] = set()
    aliases: set[str] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            aliases.add(name)
        seen.add(id(param))
    return aliases


def copy_tokenizer(
    source: str, target: str, trust_remote_code: bool, chat_template: str | None = None
) -> None:
    """The tokenizer files of ``source`` into ``target`` (saved through transformers when the
    folder has none of the known file names). ``chat_template`` (verl's
    ``custom_chat_template``, which the run rendered its prompts with) is written as
    ``chat_template.jinja``, which transformers reads before the tokenizer config's own."""
    copied = False
    for name in TOKENIZER_FILES:
        src = os.path.join(source, name)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(target, name))
            copied = True
    if not copied:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        tokenizer.save_pretrained(target)
    if chat_template is not None:
        with open(os.path.join(target, CHAT_TEMPLATE_FILE), "w", encoding="utf-8") as handle:
            handle.write(chat_template)
