"""The rendezvous port is picked seconds before rank 0 binds it, so it is taken where the kernel
never hands out ports by itself (outgoing connections, ``bind(0)``): outside the ephemeral
range. A port in use is never picked."""

from __future__ import annotations

import socket

from polyrl.workers import rendezvous
from polyrl.workers.rendezvous import RENDEZVOUS_PORTS, ephemeral_ports, rendezvous_port


def test_the_port_is_free_and_outside_the_kernels_ephemeral_range() -> None:
    low, high = ephemeral_ports()
    for _ in range(20):
        port = rendezvous_port("127.0.0.1")
        assert not low <= port <= high
        assert RENDEZVOUS_PORTS[0] <= port < RENDEZVOUS_PORTS[1]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: rank 0 can bind it


def test_a_port_in_use_is_skipped(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = busy + 1 if busy + 1 < 65536 else busy - 1
        monkeypatch.setattr(rendezvous, "RENDEZVOUS_PORTS", (min(busy, free), max(busy, free) + 1))
        monkeypatch.setattr(rendezvous, "ephemeral_ports", lambda: (0, 0))
        picks = {rendezvous_port("127.0.0.1") for _ in range(10)}
    assert busy not in picks


def test_the_kernel_picks_when_the_range_has_no_free_port(monkeypatch) -> None:
    monkeypatch.setattr(rendezvous, "ephemeral_ports", lambda: RENDEZVOUS_PORTS)
    port = rendezvous_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_group_of_one_binds_a_free_port_itself() -> None:
    """The in-process worker passes port 0: its store serves on a port the kernel gives it,
    bound at once, so nothing can take it between the choice and the bind."""
    from datetime import timedelta

    store = rendezvous.rendezvous_store("127.0.0.1", 0, 0, 1, timedelta(seconds=10))
    assert store.port > 0
    store.set("key", "value")
    assert store.get("key") == b"value"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", store.port)) == 0
