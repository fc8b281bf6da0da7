"""torch.distributed's rendezvous store, listening on the rendezvous address only.

``init_method="tcp://host:port"`` makes rank 0's ``TCPStore`` listen on every interface whatever
``host`` is; on a single machine (``127.0.0.1``) that opens a port to the network for no reason.
Rank 0 here binds the socket itself, to ``host``, and hands it to the store.

The port is chosen by the driver seconds before rank 0 binds it (rank 0's process starts and
imports in between), so it is taken outside the kernel's ephemeral range: every outgoing
connection on the machine (Ray opens many) takes a port from that range, and one of them could
take a port picked there before rank 0 binds it.
"""

from __future__ import annotations

import random
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any


def rendezvous_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Any:
    """The ``TCPStore`` for ``init_process_group(store=...)``: served by rank 0 on ``host:port``
    only, joined by the other ranks. Port 0, for a group of one: rank 0 binds a free port
    itself (the store's ``port``), so no other process can take it between the choice and the
    bind."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    fd, bound = listen_on(host, port, backlog=max(64, world_size))
    return dist.TCPStore(
        host, bound, world_size, is_master=True, timeout=timeout, master_listen_fd=fd
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


#: Linux's default ``net.ipv4.ip_local_port_range``, when it cannot be read.
EPHEMERAL_PORTS = (32768, 60999)
#: Where a rendezvous port is looked for: below the ephemeral range, above the well-known
#: services' ports.
RENDEZVOUS_PORTS = (20000, 32767)


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for ports it assigns itself (outgoing connections, ``bind(0)``)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return EPHEMERAL_PORTS


def rendezvous_port(host: str, *, attempts: int = 64) -> int:
    """A port free on ``host`` now and outside the kernel's ephemeral range (see the module's
    docstring); a port the kernel picks when the machine's ranges leave no such port free."""
    low, high = ephemeral_ports()
    candidates = [p for p in range(*RENDEZVOUS_PORTS) if not low <= p <= high]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in random.sample(candidates, min(attempts, len(candidates))):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
