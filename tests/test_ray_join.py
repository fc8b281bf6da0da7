"""Joining a Ray cluster never waits without bound (real ``polyrl train`` processes): a port
where something other than Ray listens is one line, SIGTERM is honoured while the run waits for
it to answer, and a joined cluster (this session's shared one, tests/conftest.py) lacking the
asked GPUs is one line once its time to grow (``trainer.joined_cluster_growth_s``) is over."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TRAIN = [sys.executable, "-m", "polyrl", "train", "recipe=tiny", "trainer.val_before_train=false",
         "trainer.total_training_steps=1"]  # fmt: skip


class SilentPort:
    """Something listening on 127.0.0.1 that accepts connections and never answers."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.listener.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent_port() -> Iterator[SilentPort]:
    port = SilentPort()
    yield port
    port.close()


def _train(tmp_path: Path, *overrides: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*TRAIN, f"trainer.default_local_dir={tmp_path}", *overrides],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env},
    )  # fmt: skip


def _first_line_then_exit(proc: subprocess.Popen, timeout_s: float) -> tuple[float, list[str]]:
    """Seconds from the run's first line (its config summary, printed before Ray is reached)
    to its exit, and its stderr lines."""
    lines = [proc.stderr.readline()]
    started = time.monotonic()
    lines += proc.stderr.readlines()
    proc.wait(timeout=timeout_s)
    return time.monotonic() - started, [line.rstrip("\n") for line in lines if line.strip()]


def test_a_port_that_is_not_ray_is_one_line_within_30_s(tmp_path, silent_port) -> None:
    proc = _train(tmp_path, RAY_ADDRESS=f"127.0.0.1:{silent_port.port}")
    elapsed, lines = _first_line_then_exit(proc, timeout_s=120)
    assert proc.returncode == 2, lines[-20:]
    assert lines[-1].startswith(
        f"error: nothing at RAY_ADDRESS=127.0.0.1:{silent_port.port} answers as a Ray cluster "
        "within 10 s"
    ), lines[-20:]
    assert not any("Traceback" in line for line in lines)
    assert elapsed < 30


def test_sigterm_while_waiting_for_the_cluster_to_answer_is_honoured(tmp_path, silent_port) -> None:
    proc = _train(tmp_path, RAY_ADDRESS=f"127.0.0.1:{silent_port.port}")
    deadline = time.monotonic() + 120
    # the reachability check's connection, then the one waiting for Ray's answer
    while len(silent_port.accepted) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    lines, stop_line_after = [], None
    for line in proc.stderr:  # to the exit
        lines.append(line.rstrip("\n"))
        if line.startswith("polyrl: stopped by SIGTERM;") and stop_line_after is None:
            stop_line_after = time.monotonic() - sent
    proc.wait(timeout=60)
    assert proc.returncode == 143, lines[-20:]
    assert lines[-1].startswith("polyrl: stopped by SIGTERM;")
    assert not (tmp_path / "polyrl.lock").exists()
    # at once, not after the 10 s the answer may take (the exit after it is the interpreter's)
    assert stop_line_after is not None and stop_line_after < 5


def test_a_joined_cluster_lacking_the_gpus_asked_is_one_line_once_its_growth_time_is_over(
    tmp_path,
) -> None:
    proc = _train(tmp_path, "trainer.device=cuda", "trainer.joined_cluster_growth_s=3")
    elapsed, lines = _first_line_then_exit(proc, timeout_s=120)
    assert proc.returncode == 2, lines[-20:]
    assert lines[-1].startswith(
        "error: pool 'global' needs 2 GPU but the Ray cluster at RAY_ADDRESS=127.0.0.1:"
    )
    assert lines[-1].endswith(
        "after 3 s has 0: set trainer.device=cpu, or lower trainer.n_gpus_per_node / "
        "trainer.nnodes / trainer.resource_pools"
    )
    assert not any("Traceback" in line for line in lines)
    assert 3 <= elapsed < 30
