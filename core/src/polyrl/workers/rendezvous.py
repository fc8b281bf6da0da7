"""torch.distributed's rendezvous store, listening on the rendezvous address only.

``init_method="tcp://host:port"`` makes rank 0's ``TCPStore`` listen on every interface whatever
``host`` is; on a single machine (``127.0.0.1``) that opens a port to the network for no reason.
Rank 0 here binds the socket itself, to ``host``, and hands it to the store.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any


def rendezvous_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Any:
    """The ``TCPStore`` for ``init_process_group(store=...)``: served by rank 0 on ``host:port``
    only, joined by the other ranks."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    fd, _ = listen_on(host, port, backlog=max(64, world_size))
    return dist.TCPStore(
        host, port, world_size, is_master=True, timeout=timeout, master_listen_fd=fd
    )


def listen_on(host: str, port: int = 0, *, backlog: int = 64) -> tuple[int, int]:
    """A listening socket on ``host:port`` only (port 0: a free one), for a ``TCPStore`` to
    serve on (its own server would listen on every interface): ``(descriptor, port)``. The
    descriptor is detached from the socket object: the store owns it from then on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(backlog)
    bound = int(listener.getsockname()[1])
    return listener.detach(), bound
