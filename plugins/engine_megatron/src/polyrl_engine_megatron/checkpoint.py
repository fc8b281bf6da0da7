"""Checkpoints of the Megatron engine: one shard per tensor- and pipeline-parallel rank, plus
per-rank state.

Layout of a checkpoint folder::

    <path>/model_optim_tp<t>.pt        tensor-parallel rank t's weights and AdamW state (written
                                       by its first data-parallel replica; the others are copies)
    <path>/model_optim_tp<t>_pp<p>.pt  the same for stage p, when the model has several stages
    <path>/extra_state_rank_<r>.pt     LR schedule, RNG states, step and parallel layout of rank r

Nothing is gathered to save. The shards are tied to the tensor- and pipeline-parallel sizes
(checked on load, one line if they differ); the data-parallel size may change (a rank without its
own extra state takes rank 0's, as in the FSDP engine). A one-stage model keeps the shard names
it had before pipeline parallelism existed, so those checkpoints still load.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from polyrl.api import load_plain
from polyrl_engine_kit.checkpoint import CheckpointError

EXTRA_STATE = "extra_state_rank_{rank}.pt"


def shard_name(tp_rank: int, pp_rank: int, pp_size: int) -> str:
    """The file of one tensor- and pipeline-parallel rank's weights and optimizer state."""
    stage = f"_pp{pp_rank:02d}" if pp_size > 1 else ""
    return f"model_optim_tp{tp_rank:02d}{stage}.pt"


def save(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Any],
    *,
    shard: str,
    writes_shard: bool,
) -> None:
    """Write this rank's part (collective: ends with a barrier)."""
    os.makedirs(path, exist_ok=True)
    if writes_shard:
        state = {
            "model": model.state_dict(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
        }
        torch.save(state, os.path.join(path, shard))
    torch.save(extra, os.path.join(path, EXTRA_STATE.format(rank=dist.get_rank())))
    dist.barrier()


def load(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    shard: str,
    layout: dict[str, int],
) -> dict[str, Any]:
    """Restore weights and optimizer state in place; return this rank's extra state."""
    extra_path = os.path.join(path, EXTRA_STATE.format(rank=dist.get_rank()))
    if not os.path.isfile(extra_path):
        extra_path = os.path.join(path, EXTRA_STATE.format(rank=0))
    shard_path = os.path.join(path, shard)
    if not os.path.isfile(extra_path):
        raise CheckpointError(
            f"{path!r} is not a Megatron engine checkpoint (no {EXTRA_STATE.format(rank=0)}); "
            f"pass the folder that save_checkpoint wrote"
        )
    extra = load_plain(extra_path)
    if extra.get("layout") != layout:
        raise CheckpointError(
            f"{path!r} was written with {extra.get('layout')} but this engine runs with {layout}; "
            f"load it with the same actor_rollout_ref.actor.megatron sizes"
        )
    if not os.path.isfile(shard_path):
        raise CheckpointError(f"{path!r} has no {shard}: the checkpoint is incomplete")
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
