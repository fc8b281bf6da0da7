"""Sharded checkpoints through DeepSpeed, plus the state DeepSpeed does not keep per rank.

Layout of a checkpoint folder::

    <path>/polyrl/mp_rank_00_model_states.pt            DeepSpeed: module (rank 0)
    <path>/polyrl/zero_pp_rank_<r>_mp_rank_00_optim_states.pt   ZeRO partitions of rank r
    <path>/extra_state_rank_<r>.pt                     LR schedule, RNG states, step, layout

Each rank writes its own ZeRO partition (no gather). DeepSpeed's ``client_state`` is written by
rank 0 only, so the per-rank RNG states go to one extra file per rank, as in the FSDP engine. A
ZeRO checkpoint is tied to its world size and stage (DeepSpeed can convert it offline with
``ds_to_universal``); loading checks both and says so instead of failing deep inside DeepSpeed.

DeepSpeed reads its files with ``torch.load(weights_only=False)``, which runs whatever a pickle in
them calls. Every file it reads goes through its engine's ``checkpoint_engine.load``, so while
polyrl loads a checkpoint that method is :func:`polyrl.api.load_plain` (tensors and plain data)
admitting only the few DeepSpeed classes its optimizer files hold (:func:`deepspeed_classes`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from polyrl.api import load_plain
from polyrl_engine_kit.checkpoint import CheckpointError, model_in_one_process

TAG = "polyrl"
EXTRA_STATE = "extra_state_rank_{rank}.pt"


def deepspeed_classes() -> list[type]:
    """The classes DeepSpeed's ZeRO optimizer files pickle besides tensors and plain data: the
    loss scaler (static or dynamic), the ZeRO stage and the fragment addresses of the flat
    partitions. Rebuilt from their saved attributes; nothing else in a file is admitted."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


class _TensorOnlyReads:
    """DeepSpeed's checkpoint engine, writing as before, reading through :func:`load_plain`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._allowed = deepspeed_classes()

    def load(self, path: str, map_location: Any = None) -> Any:
        return load_plain(path, self._allowed)  # on the CPU, as DeepSpeed asks for

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def _tensor_only_reads(engine: Any) -> Iterator[None]:
    inner = engine.checkpoint_engine
    engine.checkpoint_engine = _TensorOnlyReads(inner)
    try:
        yield
    finally:
        engine.checkpoint_engine = inner


class _TensorOnlyTorch:
    """``torch`` as DeepSpeed's ``zero_to_fp32`` module sees it while polyrl reads a checkpoint
    with it: ``torch.load`` is :func:`polyrl.api.load_plain`, everything else is torch's."""

    def __init__(self) -> None:
        self._allowed = deepspeed_classes()

    def load(self, path: str, map_location: Any = None, **_ignored: Any) -> Any:
        return load_plain(path, self._allowed)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def read_checkpoint(path: str, cfg: Any, model_path: str) -> torch.nn.Module:
    """The model of the checkpoint at ``path`` whole on this process's CPU, in float32, for
    ``polyrl export`` (the spec's ``checkpoint_reader``): the fp32 master weights consolidated
    from every rank's ZeRO partition (stage 1, 2 or 3) by DeepSpeed's own ``zero_to_fp32``,
    whose file reads are tensor-only (:class:`_TensorOnlyTorch`), in one process of any size.
    """
    from deepspeed.utils import zero_to_fp32

    if not os.path.isdir(os.path.join(path, TAG)):
        raise CheckpointError(
            f"{path!r} is not a DeepSpeed engine checkpoint (no {TAG}/ folder); pass the folder "
            f"that save_checkpoint wrote"
        )
    model, _settings = model_in_one_process(cfg, model_path)
    module_torch = zero_to_fp32.torch
    zero_to_fp32.torch = _TensorOnlyTorch()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # its progress lines are not our output
            state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(path, tag=TAG)
    finally:
        zero_to_fp32.torch = module_torch
    model.load_state_dict(state)
    return model


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
    with _tensor_only_reads(engine):
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
