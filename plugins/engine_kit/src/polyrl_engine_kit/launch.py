"""Run a function on N local ranks with a real process group, with a deadline.

For tests and benchmarks without Ray: each rank is a spawned process that joins a gloo (CPU) or
NCCL (CUDA) group over loopback, runs ``fn(rank, world_size, *args)`` and returns a picklable
value. A rank that hangs (e.g. mismatched collectives) makes :func:`run_on_ranks` raise
``TimeoutError`` after killing every rank, instead of hanging the caller.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    port: int,
    backend: str,
    result_dir: str,
    timeout_s: float,
    threads: int,
    args: tuple[Any, ...],
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(result_dir, f"rank_{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    threads_per_rank: int = 1,
) -> list[Any]:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, world_size, *args)]`` computed in
    ``world_size`` spawned processes forming one process group; ``fn`` must be importable."""
    with tempfile.TemporaryDirectory(prefix="polyrl_ranks_") as result_dir:
        context = mp.start_processes(
            _rank_main,
            args=(
                fn,
                world_size,
                free_port(),
                backend,
                result_dir,
                timeout_s,
                threads_per_rank,
                args,
            ),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{getattr(fn, '__name__', fn)} did not finish on {world_size} ranks "
                        f"within {timeout_s:.0f} s (a collective hung?)"
                    )
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(5)
        return [
            torch.load(os.path.join(result_dir, f"rank_{r}.pt"), weights_only=False)
            for r in range(world_size)
        ]
