"""Sharded checkpoints (torch.distributed.checkpoint) and Hugging Face export.

Layout of a checkpoint folder::

    <path>/.metadata, <path>/__<rank>_0.distcp   DCP: {"model": ..., "optim": ...} sharded
    <path>/extra_state_rank_<r>.pt              LR schedule, RNG states, step counter of rank r

Each rank writes only its shards, so saving costs no all-gather and a checkpoint can be loaded
on another world size (DCP reshards). RNG states differ per rank, hence one extra file each.

A LoRA engine passes ``keep`` (the names of its adapter tensors): the model part then holds the
adapters only (the frozen base weights are the model folder's, they need no copy) and the
optimizer part the adapters' AdamW state (the only parameters it has).
"""

from __future__ import annotations

import os
import random
import shutil
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from polyrl.api import PolyrlError, SafeFileSystemReader, load_plain

EXTRA_STATE = "extra_state_rank_{rank}.pt"
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


def _dcp_state(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, keep: set[str] | None
) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` (no ``optim`` without an optimizer); the model's
    tensors limited to the names in ``keep`` unless it is None."""
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
    if keep is not None:
        state["model"] = {k: v for k, v in state["model"].items() if k in keep}
    return state


def save_sharded(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Any],
    keep: set[str] | None = None,
) -> None:
    """Write the DCP shards (the model's tensors named in ``keep``, all when None) and this
    rank's extra state (collective)."""
    os.makedirs(path, exist_ok=True)
    dcp.save(_dcp_state(model, optimizer, keep), checkpoint_id=path)
    torch.save(extra, os.path.join(path, EXTRA_STATE.format(rank=dist.get_rank())))
    dist.barrier()


def load_sharded(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    keep: set[str] | None = None,
) -> dict[str, Any]:
    """Load the shards into ``model``/``optimizer`` in place (the model's tensors named in
    ``keep``, all when None); return this rank's extra state (rank 0's when the checkpoint was
    written by fewer ranks)."""
    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise CheckpointError(
            f"{path!r} is not an FSDP engine checkpoint (no DCP .metadata file); pass the folder "
            f"that save_checkpoint wrote"
        )
    state = _dcp_state(model, optimizer, keep)
    saved = set(SafeFileSystemReader(path).read_metadata().state_dict_metadata)
    if optimizer is not None and not any(key.startswith("optim.") for key in saved):
        raise CheckpointError(
            f"{path!r} holds no optimizer state (written by a non-trainable engine); "
            f"a trainable engine cannot resume from it"
        )
    _check_model_keys(path, state["model"], saved)
    dcp.load(state, storage_reader=SafeFileSystemReader(path))
    options = StateDictOptions(strict=keep is None)
    if optimizer is None:
        set_model_state_dict(model, state["model"], options=options)
    else:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=options,
        )
    extra_path = os.path.join(path, EXTRA_STATE.format(rank=dist.get_rank()))
    if not os.path.isfile(extra_path):
        extra_path = os.path.join(path, EXTRA_STATE.format(rank=0))
    if not os.path.isfile(extra_path):
        raise CheckpointError(f"{path!r} lacks {EXTRA_STATE.format(rank=0)} (incomplete save?)")
    return load_plain(extra_path)


def _check_model_keys(path: str, wanted: dict[str, Any], saved: set[str]) -> None:
    """Every model tensor the engine loads is in the checkpoint: a LoRA checkpoint holds the
    adapters only, a full one no adapters, so neither resumes the other kind of run."""
    missing = sorted(name for name in wanted if f"model.{name}" not in saved)
    if missing:
        held = sum(key.startswith("model.") for key in saved)
        raise CheckpointError(
            f"{path!r} lacks {len(missing)} of the {len(wanted)} model tensors this engine "
            f"loads (e.g. {missing[0]!r}; it holds {held}): resume with the LoRA settings "
            f"(actor_rollout_ref.model.lora_rank, target_modules) of the run that wrote it"
        )


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
        )


def write_adapter_export(
    path: str,
    model: nn.Module,
    adapters: dict[str, torch.Tensor],
    settings: Any,
    model_path: str,
) -> None:
    """A LoRA run's HF export (rank 0 only): the adapter folder peft loads
    (``PeftModel.from_pretrained(base, path)``) with the tokenizer files beside it."""
    from polyrl_engine_fsdp.lora import write_adapter_folder

    write_adapter_folder(path, model, adapters)
    _copy_tokenizer(settings.tokenizer_path or model_path, path, settings.trust_remote_code)


def full_state_dict_on_rank0(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model on rank 0's CPU (other ranks get an empty dict); collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def write_hf_folder(
    path: str,
    state_dict: dict[str, torch.Tensor],
    hf_config: Any,
    dtype: torch.dtype,
    tokenizer_source: str,
    trust_remote_code: bool = False,
) -> None:
    """Save ``state_dict`` as a ``save_pretrained`` folder (safetensors) plus tokenizer files.

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
    model.save_pretrained(path)
    _copy_tokenizer(tokenizer_source, path, trust_remote_code)


def _alias_names(model: nn.Module) -> set[str]:
    """Names of parameters that are the same object as an earlier one (tied weights)."""
    seen: set[int] = set()
    aliases: set[str] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            aliases.add(name)
        seen.add(id(param))
    return aliases


def _copy_tokenizer(source: str, target: str, trust_remote_code: bool) -> None:
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
