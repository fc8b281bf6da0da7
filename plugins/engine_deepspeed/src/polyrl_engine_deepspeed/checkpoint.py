"""Sharded checkpoints through DeepSpeed, plus the state DeepSpeed does not keep per rank.

Layout of a checkpoint folder::

    <path>/polyrl/mp_rank_00_model_states.pt            DeepSpeed: module (rank 0)
    <path>/polyrl/zero_pp_rank_<r>_mp_rank_00_optim_states.pt   ZeRO partitions of rank r
    <path>/extra_state_rank_<r>.pt                     LR schedule, RNG states, step, layout

Each rank writes its own ZeRO partition (no gather). DeepSpeed's ``client_state`` is written by
rank 0 only, so the per-rank RNG states go to one extra file per rank, as in the FSDP engine. A
ZeRO checkpoint is tied to its world size and stage (DeepSpeed can convert it offline with
``ds_to_universal``); loading checks both and says so instead of failing deep inside DeepSpeed.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from polyrl.api import load_plain
from polyrl_engine_kit.checkpoint import CheckpointError

TAG = "polyrl"
EXTRA_STATE = "extra_state_rank_{rank}.pt"


def save(path: str, engine: Any, extra: dict[str, Any]) -> None:
    """Write DeepSpeed's shards and this rank's extra state (collective)."""
    os.makedirs(path, exist_ok=True)
    engine.save_checkpoint(path, tag=TAG, save_latest=False)
    torch.save(extra, os.path.join(path, EXTRA_STATE.format(rank=dist.get_rank())))
    dist.barrier()


def load(path: str, engine: Any, layout: dict[str, int], with_optimizer: bool) -> dict[str, Any]:
    """Load the shards into ``engine`` in place; return this rank's extra state. ``layout``
    (world size, ZeRO stage) must be the one the checkpoint was written with."""
    extra_path = os.path.join(path, EXTRA_STATE.format(rank=dist.get_rank()))
    if not os.path.isdir(os.path.join(path, TAG)) or not os.path.isfile(extra_path):
        raise CheckpointError(
            f"{path!r} is not a DeepSpeed engine checkpoint of this world size (no {TAG}/ folder "
            f"or no {EXTRA_STATE.format(rank=dist.get_rank())}); pass the folder that "
            f"save_checkpoint wrote"
        )
    extra = load_plain(extra_path)
    saved = extra.get("layout", {})
    if saved != layout:
        raise CheckpointError(
            f"{path!r} was written with {saved} but this engine runs with {layout}; a ZeRO "
            f"checkpoint loads on the same world size and zero_stage (convert it with "
            f"DeepSpeed's ds_to_universal to change them)"
        )
    loaded, _ = engine.load_checkpoint(
        path,
        tag=TAG,
        load_optimizer_states=with_optimizer,
        load_lr_scheduler_states=False,
        load_module_strict=True,
    )
    if loaded is None:
        raise CheckpointError(f"DeepSpeed found no checkpoint under {os.path.join(path, TAG)!r}")
    return extra
