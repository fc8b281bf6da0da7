"""Run a function on N local ranks with a real process group, with a deadline.

For tests and benchmarks without Ray: each rank is a new process that joins a gloo (CPU) or
NCCL (CUDA) group over loopback, runs ``fn(rank, world_size, *args)`` and returns a picklable
value. A rank that hangs (e.g. mismatched collectives) makes :func:`run_on_ranks` raise
``TimeoutError`` after killing every rank, instead of hanging the caller.

Gloo ranks are forked from multiprocessing's fork server, which imports :data:`PRELOAD` once (set
when this module is imported: it is meant for test and benchmark processes): a spawned rank
would import torch, transformers and megatron-core again, seconds of CPU per rank and most of a
small test's time. The server runs no threads and no collective, so the forked ranks start as
clean as spawned ones; each gets the caller's current environment.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Modules the fork server imports before forking ranks, where installed (it skips the others).
PRELOAD = (
    "torch",
    "torch.distributed",
    "transformers",
    "transformers.modeling_utils",
    "megatron.core",
)


_FORKSERVER = "forkserver" in multiprocessing.get_all_start_methods()
if _FORKSERVER:
    # Set on import, before any code of the process starts the (one, shared) fork server: a
    # server started first by other code (a reward runner's) would fork ranks without it.
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))


def _start_method(backend: str) -> str:
    """``forkserver`` where available, else ``spawn``. NCCL ranks are spawned: no CUDA state of
    any kind may reach them through a fork."""
    return "forkserver" if _FORKSERVER and backend != "nccl" else "spawn"


def _rendezvous(rank: int, world_size: int, result_dir: str, timeout_s: float) -> Any:
    """The group's ``TCPStore``: rank 0 serves it on a loopback port the kernel gives it, bound
    at once, and writes the port where the other ranks wait for it (a port chosen by the caller
    could be taken by another process before rank 0 binds it)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    port_file = os.path.join(result_dir, "port")
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(max(64, world_size))
        port = int(listener.getsockname()[1])
        store = dist.TCPStore(
            "127.0.0.1", port, world_size, is_master=True, timeout=timeout,
            wait_for_workers=False, master_listen_fd=listener.detach(),
        )  # fmt: skip
        with open(port_file + ".tmp", "w") as handle:
            handle.write(str(port))
        os.replace(port_file + ".tmp", port_file)
        return store
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(port_file):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not serve the group's store within {timeout_s:.0f} s")
        time.sleep(0.01)
    with open(port_file) as handle:
        port = int(handle.read())
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)


def _rank_main(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    backend: str,
    result_dir: str,
    timeout_s: float,
    threads: int,
    env: dict[str, str],
    args: tuple[Any, ...],
) -> None:
    os.environ.clear()  # a forked rank has the fork server's environment, not the caller's
    os.environ.update(env)
    store = _rendezvous(rank, world_size, result_dir, timeout_s)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        store=store,
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
                backend,
                result_dir,
                timeout_s,
                threads_per_rank,
                dict(os.environ),
                args,
            ),
            nprocs=world_size,
            join=False,
            start_method=_start_method(backend),
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
