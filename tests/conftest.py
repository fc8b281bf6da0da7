"""One Ray cluster for the end-to-end runs of this folder.

Starting and stopping Ray is most of a short ``polyrl train`` on a small machine. So the session
starts one head node on 127.0.0.1 (single-machine mode, like the cluster ``polyrl train`` starts
for itself), and every test here runs with ``RAY_ADDRESS`` pointing at it: the runs join it as a
user's runs join a cluster. After each test the cluster must hold no actor and no placement group
(within :data:`RELEASE_TIMEOUT_S`), so each test starts on a clean cluster and a run that leaks
its workers fails the test that ran it.

These keep a Ray of their own (:data:`KEEP_OWN_RAY`), and why:

- test_faults_environment.py: looks at what the run's own process tree listens on, signals the
  run while its own Ray starts, and needs the cluster that the run started itself (which fails at
  once when it lacks GPUs; a joined one may grow).
- test_faults_processes.py, test_chaos.py: kill the run's process group (Ray's processes with
  it) or Ray worker processes found among the run's children.
- test_multi_node.py: a cluster of two nodes of its own.
- test_plugin_discovery.py: plugins installed on the run's ``PYTHONPATH``; a joined cluster's
  workers start from the cluster's environment, not the run's.

core/tests/test_workers_ray.py and the plugins' tests are outside this folder and start Ray in
the test process where they need it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_nodes import free_port, head_args, node_args, start_node, stop_nodes, wait_for_start

from polyrl.workers.cluster_probe import held_by_jobs

#: Tests (node ids under tests/, or their beginnings) that start a Ray of their own.
KEEP_OWN_RAY = (
    "test_faults_environment.py",
    "test_faults_processes.py",
    "test_chaos.py",
    "test_multi_node.py",
    "test_plugin_discovery.py",
)
#: How long a finished run's workers and placement groups may take to be released.
RELEASE_TIMEOUT_S = 30.0
#: Ray's CPUs are reservations, not cores: enough for the largest set of pools a test here
#: starts (a reference on a pool of its own beside the actor's two workers).
SHARED_CLUSTER_CPUS = max(4, os.cpu_count() or 1)
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # see polyrl.workers.worker_group


def _keeps_own_ray(nodeid: str) -> bool:
    return nodeid.removeprefix("tests/").startswith(KEEP_OWN_RAY)


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[str]:
    """The address of a Ray head on 127.0.0.1, started for this session and always stopped."""
    temp_dir = tempfile.mkdtemp(prefix="polyrl-ray-")  # short: Ray's socket paths are limited
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",  # nothing outside this machine can connect
        "RAY_worker_niceness": "0",  # the workers are the compute (see ensure_ray)
        "RAY_prestart_worker_first_driver": "0",  # idle workers no job uses (see ensure_ray)
        _LOOPBACK_ENV: "0",
    }
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    address = f"127.0.0.1:{port}"
    log = Path(temp_dir, "head.log")
    head = start_node([*head_args(port), *node_args(SHARED_CLUSTER_CPUS, temp_dir)], log, env)
    try:
        wait_for_start(head, log, timeout_s=90)
        yield address
    finally:
        stop_nodes([head], temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _join_the_shared_ray(request: pytest.FixtureRequest) -> Iterator[None]:
    """``RAY_ADDRESS`` of the shared cluster for the test, and after it a clean cluster."""
    if _keeps_own_ray(request.node.nodeid):
        yield
        return
    address = request.getfixturevalue("shared_ray")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ADDRESS", address)
        patch.setenv("RAY_AUTH_MODE", "disabled")
        yield
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while held := held_by_jobs(address):
        if time.monotonic() > deadline:
            pytest.fail(f"after the test the shared Ray cluster still holds {held}")
        time.sleep(0.5)
