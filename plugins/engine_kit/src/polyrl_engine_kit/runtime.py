"""Where an engine runs: its device, its place in the default process group, its seeds.

Every polyrl training engine starts the same way (the worker owns the process group and the
device; a lone process, as in a test, gets a 1-rank group of its own), so the rules and their
messages live here once. Each function takes the engine's name or backend where they differ.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.distributed as dist

from polyrl.api import EngineContext
from polyrl_engine_kit.errors import EngineUsageError


def resolve_device(name: str, engine: str) -> torch.device:
    """``trainer.device`` as a torch device (the current CUDA device for ``cuda``); ``engine``
    names who refuses anything else, e.g. ``"the FSDP engine"``."""
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise EngineUsageError("trainer.device=cuda but torch sees no CUDA device")
        return torch.device("cuda", torch.cuda.current_device())
    if name != "cpu":
        raise EngineUsageError(f"device {name!r} is not supported by {engine}: cpu or cuda")
    return torch.device("cpu")


def join_default_group(ctx: EngineContext, backend: str) -> None:
    """Use the worker's process group; for a lone process without one, make a 1-rank group on
    ``backend``. The group must agree with the rank and world size ``ctx`` announces."""
    if not dist.is_initialized():
        if ctx.world_size != 1:
            raise EngineUsageError(
                f"torch.distributed is not initialised but world_size={ctx.world_size}; the "
                f"worker must call torch.distributed.init_process_group before building the engine"
            )
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if dist.get_world_size() != ctx.world_size or dist.get_rank() != ctx.rank:
        raise EngineUsageError(
            f"EngineContext says rank {ctx.rank} of {ctx.world_size} but the default process "
            f"group is rank {dist.get_rank()} of {dist.get_world_size()}"
        )


def default_backend(device: torch.device) -> str:
    """The backend of a lone process's own group: NCCL on a GPU, gloo on the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators, so that a run with the same seed repeats."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
