"""Sharded checkpoints of the FSDP engine (torch.distributed.checkpoint).

Layout of a checkpoint folder::

    <path>/.metadata, <path>/__<rank>_0.distcp   DCP: {"model": ..., "optim": ...} sharded
    <path>/extra_state_rank_<r>.pt              LR schedule, RNG states, step counter of rank r

Each rank writes only its shards, so saving costs no all-gather and a checkpoint can be loaded
on another world size (DCP reshards). The extra state and the HF export are the engines' shared
ones (:mod:`polyrl_engine_kit.checkpoint`); their names are still found here, with a deprecation
warning.

A LoRA engine passes ``keep`` (the names of its adapter tensors): the model part then holds the
adapters only (the frozen base weights are the model folder's, they need no copy) and the
optimizer part the adapters' AdamW state (the only parameters it has).
"""

from __future__ import annotations

import os
from typing import Any

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

from polyrl.api import SafeFileSystemReader, load_plain
from polyrl_engine_kit.checkpoint import (
    EXTRA_STATE,
    CheckpointError,
    copy_tokenizer,
    model_in_one_process,
)
from polyrl_engine_kit.moved import moved_names

__getattr__ = moved_names(
    __name__,
    "polyrl_engine_kit.checkpoint",
    {
        "TOKENIZER_FILES",
        "rng_state",
        "set_rng_state",
        "loop_state",
        "restore_loop_state",
        "export_on_rank0",
        "write_hf_folder",
    },
)


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
    saved = _saved_keys(path)
    state = _dcp_state(model, optimizer, keep)
    if optimizer is not None and not any(key.startswith("optim.") for key in saved):
        raise CheckpointError(
            f"{path!r} holds no optimizer state (written by a non-trainable engine); "
            f"a trainable engine cannot resume from it"
        )
    _check_model_keys(path, state["model"], saved)
    SafeFileSystemReader(path).load(state)
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


def _saved_keys(path: str) -> set[str]:
    """The flattened names of what the DCP checkpoint at ``path`` holds."""
    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise CheckpointError(
            f"{path!r} is not an FSDP engine checkpoint (no DCP .metadata file); pass the folder "
            f"that save_checkpoint wrote"
        )
    return set(SafeFileSystemReader(path).read_metadata().state_dict_metadata)


def read_checkpoint(path: str, cfg: Any, model_path: str) -> nn.Module:
    """The model of the checkpoint at ``path`` whole on this process's CPU, in float32, for
    ``polyrl export`` (the spec's ``checkpoint_reader``): no process group, any number of
    ranks having written it (DCP reads each tensor from the shards that hold its parts).

    ``cfg`` is the run config it was saved with: a LoRA run's checkpoint holds the adapters
    only, so the model is the base model of ``model_path`` wrapped by peft as the run did, with
    the saved adapters.
    """
    from polyrl_engine_fsdp.lora import adapter_names, apply_lora

    saved = _saved_keys(path)
    model, settings = model_in_one_process(cfg, model_path)
    if settings.lora is not None:
        model = apply_lora(model, settings.lora)
    keep = None if settings.lora is None else adapter_names(model)
    state = {"model": {k: v for k, v in model.state_dict().items() if keep is None or k in keep}}
    _check_model_keys(path, state["model"], saved)
    SafeFileSystemReader(path).load(state)  # into the model's own tensors
    return model


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
    source = settings.tokenizer_path or model_path
    copy_tokenizer(source, path, settings.trust_remote_code, settings.chat_template)


def full_state_dict_on_rank0(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model on rank 0's CPU (other ranks get an empty dict); collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
