"""Checkpoints of the Megatron engine: one shard per tensor-parallel rank, plus per-rank state.

Layout of a checkpoint folder::

    <path>/model_optim_tp<t>.pt      tensor-parallel rank t's weights and AdamW state (written
                                     by its first data-parallel replica; the others are copies)
    <path>/extra_state_rank_<r>.pt   LR schedule, RNG states, step and parallel layout of rank r

Nothing is gathered to save. The shards are tied to the tensor-parallel size (checked on load,
one line if it differs); the data-parallel size may change (a rank without its own extra state
takes rank 0's, as in the FSDP engine).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from polyrl.safe_load import load_plain
from polyrl_engine_fsdp.checkpoint import CheckpointError

SHARD = "model_optim_tp{tp:02d}.pt"
EXTRA_STATE = "extra_state_rank_{rank}.pt"


def save(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Any],
    *,
    tp_rank: int,
    writes_shard: bool,
) -> None:
    """Write this rank's part (collective: ends with a barrier)."""
    os.makedirs(path, exist_ok=True)
    if writes_shard:
        state = {
            "model": model.state_dict(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
        }
        torch.save(state, os.path.join(path, SHARD.format(tp=tp_rank)))
    torch.save(extra, os.path.join(path, EXTRA_STATE.format(rank=dist.get_rank())))
    dist.barrier()


def load(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    tp_rank: int,
    layout: dict[str, int],
) -> dict[str, Any]:
    """Restore weights and optimizer state in place; return this rank's extra state."""
    extra_path = os.path.join(path, EXTRA_STATE.format(rank=dist.get_rank()))
    if not os.path.isfile(extra_path):
        extra_path = os.path.join(path, EXTRA_STATE.format(rank=0))
    shard_path = os.path.join(path, SHARD.format(tp=tp_rank))
    if not os.path.isfile(extra_path) or not os.path.isfile(shard_path):
        raise CheckpointError(
            f"{path!r} is not a Megatron engine checkpoint (no {SHARD.format(tp=tp_rank)} or "
            f"{EXTRA_STATE.format(rank=0)}); pass the folder that save_checkpoint wrote"
        )
    extra = load_plain(extra_path)
    if extra.get("layout") != layout:
        raise CheckpointError(
            f"{path!r} was written with {extra.get('layout')} but this engine runs with {layout}; "
            f"load it with the same actor_rollout_ref.actor.megatron sizes"
        )
    state = load_plain(shard_path)  # tensors on the CPU: load_state_dict copies them over
    model.load_state_dict(state["model"])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise CheckpointError(
                f"{path!r} holds no optimizer state (written by a non-trainable engine); a "
                f"trainable engine cannot resume from it"
            )
        optimizer.load_state_dict(state["optimizer"])
    return extra
