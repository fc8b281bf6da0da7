"""Ray nodes started by a test session (``ray start --block``), and stopped again, alone.

``ray stop`` would stop every Ray on the machine, other users' included: each node here runs in a
session of its own under a temp dir of its own, and only the processes naming that dir are
stopped.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Ray's command line as its console script would run it: an install without the script (the
# lent GPU machine's unpacked Ray) still has the module.
RAY = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def head_args(port: int) -> list[str]:
    """``ray start`` arguments of a head at ``port``, every port given: the defaults (6379,
    10001, 8265) may be another Ray's."""
    return [
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        f"--dashboard-port={free_port()}",
        f"--ray-client-server-port={free_port()}",
    ]


def node_args(num_cpus: int, temp_dir: str, *extra: str) -> list[str]:
    """Arguments every node of a test cluster takes."""
    return [
        f"--num-cpus={num_cpus}",
        f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--disable-usage-stats",
        "--include-log-monitor=false",  # one process less per node; tests read no logs
        *extra,
    ]


#: What ``ray start`` prints once its node is up: after the node's raylet has registered with the
#: GCS, so a driver can join the cluster from then on.
STARTED = "Ray runtime started."


def start_node(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """``ray start --block ...`` in a session of its own, its output in ``log`` (unbuffered, so
    that :func:`wait_for_start` sees its lines as they are printed)."""
    with log.open("w") as out:
        return subprocess.Popen(
            [*RAY, "start", "--block", *args],
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for_start(node: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Until the node that :func:`start_node` started is up (:data:`STARTED` in its log).

    Reading the log costs nothing, where each ``ray status`` of :func:`wait_for_nodes` is an
    interpreter importing Ray, seconds of CPU taken from the starting node; and ``ray status``
    lists a node only once the autoscaler's monitor has reported it, seconds after a driver
    could have joined."""
    deadline = time.monotonic() + timeout_s
    while STARTED not in (text := log.read_text(errors="replace")):
        if node.poll() is not None:
            raise RuntimeError(f"ray start exited with status {node.returncode}:\n{text}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"ray start not up in {timeout_s} s:\n{text}")
        time.sleep(0.1)


def wait_for_nodes(address: str, count: int, env: dict[str, str], timeout_s: float) -> set[str]:
    """The ids of the cluster's nodes once ``count`` of them are up (``ray status`` asks the GCS;
    no driver needed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = subprocess.run(
            [*RAY, "status", f"--address={address}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        active = status.stdout.split("Active:")[-1].split("Pending:")[0]
        ids = set(re.findall(r"node_([0-9a-f]{16,})", active))
        if len(ids) >= count:
            return ids
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} Ray nodes not up in {timeout_s} s:\n{status.stdout}")
        time.sleep(0.5)


def processes_under(temp_dir: str) -> list[int]:
    """Pids of the processes whose command line names ``temp_dir``: this cluster's Ray processes
    (every one of them gets its session folder, under the temp dir, as an argument)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if temp_dir.encode() in cmdline:
            pids.append(int(entry))
    return pids


def stop_nodes(nodes: list[subprocess.Popen], temp_dir: str) -> None:
    """Stop this cluster's processes only: ``ray start --block`` stops its node's processes on
    SIGTERM; worker processes still alive after that are killed by pid."""
    for node in reversed(nodes):
        node.send_signal(signal.SIGTERM)
    for node in reversed(nodes):
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
    deadline = time.monotonic() + 10
    while (left := processes_under(temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
