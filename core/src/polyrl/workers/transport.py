"""The worker side of the weight transport between pools: a channel, and a sender and receiver.

A pool is one torch.distributed group; a process has one default group, so the actor's pool and
the rollout's pool cannot share it. The channel is a second process group of its own, on its
own TCPStore (a fresh port on the actor's rank 0): channel rank 0 is the actor's rank 0 (the
root, which holds full tensors after the gather its engine does), ranks 1.. are the rollout
workers. Gloo on CPU, NCCL on GPU.

A sync is a sequence of broadcasts from the root: per bucket (:mod:`polyrl.workers.buckets`) a
head ``[version, meta bytes, buffer bytes]``, the entries as JSON, the flat buffer; then an end
head (buffer bytes -1). Every head carries the sync's version: a receiver that expects another
version (a stale or skipped sync) raises instead of loading the wrong weights. Every collective
has the channel's timeout, so a peer that stopped makes the others raise rather than wait.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from polyrl.errors import PolyrlError
from polyrl.workers.buckets import Bucket, Entry, pack_buckets
from polyrl.workers.rendezvous import listen_on

# Test hook (never a config key): "exit" ends a receiving rollout worker with os._exit after its
# first bucket, "hang" blocks it forever before it receives anything. The end-to-end tests use
# it to check that a dead or stuck peer ends the run with a clear error in bounded time.
FAULT_ENV = "POLYRL_TEST_WEIGHT_SYNC_FAULT"


class WeightSyncError(PolyrlError):
    """A weight sync failed: a version mismatch, a peer that died or timed out, a bad probe."""


def serve_store(host: str, timeout_s: float) -> tuple[Any, int]:
    """A TCPStore served on a free port of ``host`` only (TCPStore's own server would listen on
    every interface) for a new channel: ``(store, port)``; its root keeps the store."""
    fd, port = listen_on(host)
    store = dist.TCPStore(
        host,
        port,
        None,
        True,
        timedelta(seconds=timeout_s),
        wait_for_workers=False,
        master_listen_fd=fd,
    )
    return store, port


class Channel:
    """One process's membership in a transport group (rank 0 broadcasts to all others).

    ``store`` is the root's store (:func:`serve_store`); the other ranks pass None and
    connect to ``host:port``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        size: int,
        device: str,
        timeout_s: float,
        store: Any = None,
    ) -> None:
        self.rank, self.size = rank, size
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if device == "cuda"
            else torch.device("cpu")
        )
        timeout = timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(host, port, None, False, timeout)
        self._store = store  # the root keeps the server alive as long as the channel
        if device == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group: Any = dist.ProcessGroupNCCL(store, rank, size, options)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast([tensor]).wait()

    def close(self) -> None:
        shutdown = getattr(self.group, "shutdown", None)
        if callable(shutdown) and self.device.type == "cuda":
            shutdown()
        self.group = None
        self._store = None


def send(
    channel: Channel,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    version: int,
    bucket_bytes: int,
) -> int:
    """Broadcast the stream from the root in buckets of at most ``bucket_bytes``; the bytes of
    tensor data sent."""
    sent = 0
    for bucket in pack_buckets(named_tensors, bucket_bytes):
        meta = json.dumps([list(e) for e in bucket.entries]).encode()
        _send_head(channel, version, len(meta), bucket.buffer.numel())
        channel.broadcast(torch.frombuffer(bytearray(meta), dtype=torch.uint8).to(channel.device))
        channel.broadcast(bucket.buffer.to(channel.device))
        sent += bucket.buffer.numel()
    _send_head(channel, version, 0, -1)
    return sent


def receive(channel: Channel, version: int) -> Iterator[Bucket]:
    """The buckets of the sync ``version`` as they arrive; raises :class:`WeightSyncError` when
    the root sends another version."""
    fault = os.environ.get(FAULT_ENV, "")
    if fault == "hang":
        threading.Event().wait()
    received = 0
    while True:
        head = torch.zeros(3, dtype=torch.int64, device=channel.device)
        channel.broadcast(head)
        sent_version, meta_len, buffer_len = (int(x) for x in head.tolist())
        if sent_version != version:
            raise WeightSyncError(
                f"weight sync: transport rank {channel.rank} expected version {version} but the "
                f"trainer sent version {sent_version}: the pools are out of step"
            )
        if buffer_len < 0:
            return
        meta = torch.empty(meta_len, dtype=torch.uint8, device=channel.device)
        channel.broadcast(meta)
        buffer = torch.empty(buffer_len, dtype=torch.uint8, device=channel.device)
        channel.broadcast(buffer)
        entries = [
            Entry(e[0], e[1], tuple(e[2]), *e[3:]) for e in json.loads(meta.cpu().numpy().tobytes())
        ]
        yield Bucket(entries, buffer)
        received += 1
        if fault == "exit" and received == 1:
            os._exit(1)


def _send_head(channel: Channel, version: int, meta_len: int, buffer_len: int) -> None:
    head = torch.tensor([version, meta_len, buffer_len], dtype=torch.int64)
    channel.broadcast(head.to(channel.device))
