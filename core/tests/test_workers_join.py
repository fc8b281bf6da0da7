"""Joining a Ray cluster, without Ray: what answers at ``RAY_ADDRESS`` is asked with a deadline,
a loopback-only cluster is joined on loopback, and a joined cluster lacking what a pool asks is
given a bounded time to grow before one line."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from polyrl.errors import PolyrlError
from polyrl.workers import worker_group
from polyrl.workers.cluster_probe import NotRayError, alive_node_addresses


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port where something accepts connections and never says a word (not Ray)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for conn in accepted:
        conn.close()


def test_a_port_that_is_not_ray_is_one_line_within_the_deadline(silent_port: int) -> None:
    start = time.monotonic()
    with pytest.raises(NotRayError) as caught:
        alive_node_addresses(f"127.0.0.1:{silent_port}", timeout_s=1.5)
    assert time.monotonic() - start < 5
    message = str(caught.value)
    assert message.startswith(
        f"nothing at RAY_ADDRESS=127.0.0.1:{silent_port} answers as a Ray cluster within 1.5 s"
    )
    assert "unset RAY_ADDRESS" in message and "\n" not in message


def test_a_signal_while_asking_is_handled_at_once(silent_port: int) -> None:
    """The wait looks up between polls, so a signal's Python handler runs during it (the CLI's
    SIGTERM handler raises, and the wait ends long before its deadline)."""

    class Stop(BaseException):
        pass

    def stop(*_: object) -> None:
        raise Stop

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    start = time.monotonic()
    try:
        with pytest.raises(Stop):
            alive_node_addresses(f"127.0.0.1:{silent_port}", timeout_s=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    ("address", "nodes", "loopback"),
    [
        ("127.0.0.1:6379", ["127.0.0.1"], True),
        ("localhost:6379", ["127.0.0.1", "127.0.0.1"], True),
        ("127.0.0.1:6379", ["192.0.2.2", "192.0.2.2"], False),  # ray start without the switch
        ("10.0.0.5:6379", ["127.0.0.1"], False),  # another machine's address: left to Ray
        ("127.0.0.1:6379", None, False),  # a token-protected cluster: nothing learnt
    ],
)
def test_a_cluster_on_loopback_only_is_joined_on_loopback(
    address: str, nodes: list[str] | None, loopback: bool, monkeypatch
) -> None:
    switched = []
    monkeypatch.setattr(worker_group, "alive_node_addresses", lambda *_: nodes)
    monkeypatch.setattr(worker_group, "_listen_on_loopback", lambda: switched.append(True))
    worker_group._join_on_the_cluster_address(address)
    assert switched == ([True] if loopback else [])


class FakeCluster:
    """``ray.cluster_resources`` of a cluster that gains ``gains`` after ``after_s``."""

    def __init__(self, have: dict[str, float], gains: dict[str, float], after_s: float) -> None:
        self.have, self.gains, self.since = have, gains, time.monotonic() + after_s

    def __call__(self) -> dict[str, float]:
        if time.monotonic() < self.since:
            return dict(self.have)
        return {k: self.have.get(k, 0) + self.gains.get(k, 0) for k in {*self.have, *self.gains}}


def _joined(monkeypatch, cluster: FakeCluster, growth_s: float) -> None:
    monkeypatch.setattr(worker_group, "_joined_address", "127.0.0.1:6379")
    monkeypatch.setattr(worker_group, "_started_local_cluster", False)
    monkeypatch.setattr(worker_group, "_joined_growth_s", growth_s)
    monkeypatch.setattr(worker_group.ray, "cluster_resources", cluster)


def test_a_joined_cluster_that_grows_in_time_is_used(monkeypatch) -> None:
    _joined(monkeypatch, FakeCluster({"CPU": 2}, {"GPU": 2}, after_s=0.6), growth_s=5)
    worker_group.check_cluster_fits([{"CPU": 1, "GPU": 1}] * 2, "global")


def test_a_joined_cluster_lacking_gpus_is_one_line_after_the_growth_time(monkeypatch) -> None:
    _joined(monkeypatch, FakeCluster({"CPU": 2}, {}, after_s=0), growth_s=1)
    start = time.monotonic()
    with pytest.raises(PolyrlError) as caught:
        worker_group.check_cluster_fits([{"CPU": 1, "GPU": 1}] * 2, "global")
    assert 1 <= time.monotonic() - start < 5
    assert str(caught.value) == (
        "pool 'global' needs 2 GPU but the Ray cluster at RAY_ADDRESS=127.0.0.1:6379 after 1 s "
        "has 0: set trainer.device=cpu, or lower trainer.n_gpus_per_node / trainer.nnodes / "
        "trainer.resource_pools"
    )


def test_the_cluster_this_process_started_fails_at_once(monkeypatch) -> None:
    _joined(monkeypatch, FakeCluster({"CPU": 2}, {"GPU": 2}, after_s=0.5), growth_s=60)
    monkeypatch.setattr(worker_group, "_joined_address", None)
    monkeypatch.setattr(worker_group, "_started_local_cluster", True)
    start = time.monotonic()
    with pytest.raises(PolyrlError, match=r"^pool 'global' needs 2 GPU but this machine's Ray"):
        worker_group.check_cluster_fits([{"CPU": 1, "GPU": 1}] * 2, "global")
    assert time.monotonic() - start < 0.5
