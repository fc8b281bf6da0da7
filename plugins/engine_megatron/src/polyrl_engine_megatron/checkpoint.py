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

``polyrl export`` reads a checkpoint of any layout in one process (:func:`read_checkpoint`):
the shards hold megatron-core's parameter names (local to each stage), which
:mod:`.convert` maps to Hugging Face's, so neither megatron-core nor a GPU is needed.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from polyrl.api import load_plain
from polyrl_engine_kit.checkpoint import CheckpointError, model_in_one_process
from polyrl_engine_megatron.convert import (
    GPTShape,
    is_tied_copy,
    megatron_to_hf,
    stages_of,
    virtual_stages,
)
from polyrl_engine_megatron.lora import merged_state
from polyrl_engine_megatron.moe import global_expert_name, is_expert, stack_experts

EXTRA_STATE = "extra_state_rank_{rank}.pt"
# the layout's decoder layers per pipeline stage, recorded when the stages are uneven
STAGE_LAYERS = "num_layers_per_stage"
# model chunks per stage, recorded with interleaved pipeline parallelism (shard keys "<chunk>.")
VIRTUAL = "virtual_pipeline_model_parallel_size"
# expert-parallel ranks, recorded with expert parallelism (a shard each, "_ep<e>")
EXPERT = "expert_model_parallel_size"
# LoRA's alpha / rank, recorded with LoRA adapters (the reader merges them into their weights)
LORA_SCALE = "lora_scale"
# what megatron-core's modules add to a state_dict() besides weights (None for the local spec)
_MODULE_STATE_SUFFIX = "._extra_state"


def shard_name(tp_rank: int, pp_rank: int, pp_size: int, ep_rank: int = 0, ep_size: int = 1) -> str:
    """The file of one tensor-, pipeline- and expert-parallel rank's weights and optimizer
    state."""
    stage = f"_pp{pp_rank:02d}" if pp_size > 1 else ""
    experts = f"_ep{ep_rank:02d}" if ep_size > 1 else ""
    return f"model_optim_tp{tp_rank:02d}{stage}{experts}.pt"


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
    layout: dict[str, Any],
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


def read_checkpoint(path: str, cfg: Any, model_path: str) -> torch.nn.Module:
    """The model of the checkpoint at ``path`` whole on this process's CPU, in float32, for
    ``polyrl export`` (the spec's ``checkpoint_reader``), without megatron-core or a process
    group: each stage's tensor-parallel shards are read tensor-only, joined and converted to
    the HF names and layouts by :func:`~.convert.megatron_to_hf` (as the engine streams its
    weights), one stage at a time so that only one stage's shards are in memory. The parallel
    layout is the one rank 0's extra state records; the HF shape comes from the run's model
    (``cfg``, with its ``override_config``), which the weights are loaded into strictly."""
    extra_path = os.path.join(path, EXTRA_STATE.format(rank=0))
    if not os.path.isfile(extra_path):
        raise CheckpointError(
            f"{path!r} is not a Megatron engine checkpoint (no {EXTRA_STATE.format(rank=0)}); "
            f"pass the folder that save_checkpoint wrote"
        )
    layout = load_plain(extra_path).get("layout") or {}
    tp = int(layout.get("tensor_model_parallel_size", 0))
    pp = int(layout.get("pipeline_model_parallel_size", 0))
    if tp < 1 or pp < 1:
        raise CheckpointError(f"{extra_path!r} records no parallel layout (got {layout!r})")
    model, _settings = model_in_one_process(cfg, model_path)
    shape = GPTShape.from_hf_config(model.config, tp)
    state: dict[str, torch.Tensor] = {}
    virtual = layout.get(VIRTUAL)
    counts = layout.get(STAGE_LAYERS)
    stages = stages_of(counts) if counts else virtual_stages(shape.num_layers, pp, virtual)
    if len(stages) != pp * (virtual or 1) or sum(s.num_layers for s in stages) != shape.num_layers:
        raise CheckpointError(
            f"{extra_path!r} places {counts} decoder layers on {pp} stages; the HF model of "
            f"{model_path!r} has {shape.num_layers}: export with the model the run trained"
        )
    for pp_rank in range(pp):
        ep = int(layout.get(EXPERT, 1))
        shards = _read_stage_shards(path, tp, pp_rank, pp, ep, shape)
        if LORA_SCALE in layout:  # each shard's adapters merged into its own weights
            shards = [merged_state(shard, float(layout[LORA_SCALE])) for shard in shards]
        # the rank's chunks: one, or (interleaved) chunk v under "<v>." at [v * pp + pp_rank]
        chunks = (
            [("", stages[pp_rank])]
            if virtual is None
            else [(f"{v}.", stages[v * pp + pp_rank]) for v in range(virtual)]
        )
        for prefix, stage in chunks:
            for key in shards[0]:
                local = key.removeprefix(prefix)
                if not key.startswith(prefix):
                    continue  # another chunk's weight
                if local.endswith(_MODULE_STATE_SUFFIX) or is_tied_copy(local, shape, stage):
                    continue  # megatron-core's per-module state; the tied copy of the embedding
                parts = [shard[key] for shard in shards]
                try:
                    state.update(megatron_to_hf(stage.global_name(local), parts, shape))
                except (KeyError, RuntimeError) as exc:
                    raise CheckpointError(
                        f"{path!r}: stage {pp_rank}'s {key!r} does not convert to the HF model "
                        f"of {model_path!r} ({exc}); export with the model the run trained"
                    ) from exc
        del shards
    if shape.moe:  # each expert's weights as transformers' fused tensors of its layer
        state = dict(stack_experts(iter(state.items()), shape.moe.num_experts))
    _check_names(path, state, model.state_dict())
    model.load_state_dict(state)
    return model


def _read_stage_shards(
    path: str, tp: int, pp_rank: int, pp: int, ep: int, shape: GPTShape
) -> list[dict[str, Any]]:
    """Each tensor-parallel rank's weights of a stage; with expert parallelism, every rank's
    experts (whole on each TP rank) under the model's numbers. The engine writes one file per
    (TP rank, EP rank) pair of the first lcm(TP, EP) ranks of a stage (expert-parallel ranks
    are carved out of its TP x DP ranks): TP rank t's dense weights are in the file of EP rank
    t % EP, EP rank e's experts in the file of TP rank e % TP."""
    if ep == 1:
        return [_read_shard(path, shard_name(t, pp_rank, pp)) for t in range(tp)]
    per_rank = shape.moe.num_experts // ep if shape.moe else 0
    experts: dict[str, Any] = {}
    for ep_rank in range(ep):
        shard = _read_shard(path, shard_name(ep_rank % tp, pp_rank, pp, ep_rank, ep))
        experts.update(
            (global_expert_name(name, ep_rank, per_rank), tensor)
            for name, tensor in shard.items()
            if is_expert(name)
        )
    dense = [_read_shard(path, shard_name(t, pp_rank, pp, t % ep, ep)) for t in range(tp)]
    return [{**{n: w for n, w in shard.items() if not is_expert(n)}, **experts} for shard in dense]


def _read_shard(path: str, name: str) -> dict[str, Any]:
    """One rank's model weights of the shard file ``name`` (its optimizer state is dropped)."""
    shard_path = os.path.join(path, name)
    if not os.path.isfile(shard_path):
        raise CheckpointError(f"{path!r} has no {name}: the checkpoint is incomplete")
    return load_plain(shard_path)["model"]


def _check_names(path: str, state: dict[str, Any], wanted: dict[str, Any]) -> None:
    """The converted weights are exactly the HF model's, with its shapes."""
    missing = sorted(set(wanted) - set(state))
    unexpected = sorted(set(state) - set(wanted))
    if missing or unexpected:
        raise CheckpointError(
            f"{path!r} does not hold this HF model's weights: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    wrong = [n for n, t in state.items() if tuple(t.shape) != tuple(wanted[n].shape)]
    if wrong:
        name = wrong[0]
        raise CheckpointError(
            f"{path!r}: {name} converts to {tuple(state[name].shape)}, the HF model has "
            f"{tuple(wanted[name].shape)}; export with the model the run trained"
        )
