"""End to end: ``trainer.nnodes=2`` on a real two-node Ray cluster started on this machine.

Two raylets (``ray start --head`` plus ``ray start --address=...``, one CPU each) form the
cluster; ``RAY_ADDRESS`` makes ``polyrl train`` join it. One worker lands on each node, the two
join one torch.distributed (gloo) group through the rendezvous on rank 0's node, and the run
trains. The cluster lives in a temp dir of its own and only its processes are stopped
(:mod:`ray_nodes`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from ray_nodes import (
    free_port,
    head_args,
    node_args,
    start_node,
    stop_nodes,
    wait_for_nodes,
    wait_for_start,
)
from test_train_tiny import polyrl_train, read_records

pytestmark = pytest.mark.slow

LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # see polyrl.workers.worker_group
NODE_LINE = re.compile(r"^polyrl: pool 'global': 2 worker\(s\) on (\d+) node\(s\): (.+)$", re.M)
STEPS = (
    "trainer.n_gpus_per_node=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.export_hf_model=false",
)


class Cluster(NamedTuple):
    address: str
    node_ids: set[str]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Head and worker raylet, 1 CPU each, in a temp dir of their own; always torn down."""
    temp_dir = tempfile.mkdtemp(prefix="polyrl-ray-")  # short: Ray's socket paths are limited
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0"}
    # An earlier test of this process may have started polyrl's local Ray, which switches Ray to
    # its single-machine mode through this variable; a worker node refuses to start in it.
    env.pop(LOCAL_ONLY_ENV, None)
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes: list[subprocess.Popen] = []
    try:
        logs = []
        for role in (head_args(port), [f"--address={address}"]):
            args = [*role, *node_args(1, temp_dir, "--object-store-memory=100000000")]
            logs.append(Path(temp_dir, f"node{len(nodes)}.log"))
            nodes.append(start_node(args, logs[-1], env))
        for node, log in zip(nodes, logs, strict=True):
            wait_for_start(node, log, timeout_s=90)
        # the node ids, from `ray status` once both nodes are up
        yield Cluster(address, wait_for_nodes(address, 2, env, timeout_s=90))
    finally:
        stop_nodes(nodes, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_two_nodes_train_with_one_worker_on_each(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    monkeypatch.delenv(LOCAL_ONLY_ENV, raising=False)
    run = polyrl_train(
        tmp_path, *STEPS, "trainer.nnodes=2", "trainer.total_training_steps=24", over_ray=True
    )
    lines = NODE_LINE.findall(run.stderr)
    assert len(lines) == 1, run.stderr[-4000:]
    count, where = lines[0]
    assert count == "2", where
    # rank 0 on one node, rank 1 on the other, both nodes of this cluster
    placed = re.findall(r"\(node ([0-9a-f]{8})\) ranks (\d)", where)
    assert sorted(rank for _, rank in placed) == ["0", "1"]
    assert {node for node, _ in placed} == {node[:8] for node in cluster.node_ids}
    records = read_records(tmp_path)
    assert [r["step"] for r in records] == list(range(1, 25))
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:6]) / 6, sum(scores[-6:]) / 6
    assert last > first + 0.1, f"reward did not rise: first steps {scores[:6]}, last {scores[-6:]}"


def test_more_nodes_than_the_cluster_has_fail_at_once(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    monkeypatch.delenv(LOCAL_ONLY_ENV, raising=False)
    cmd = [sys.executable, "-m", "polyrl", "train", "recipe=tiny", *STEPS, "trainer.nnodes=4",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",  # a valid config of 4 ranks
           f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=1"]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: pool 'global' needs 4 Ray nodes with {'CPU': 0.5} each, but the cluster has 2 "
        "node(s), 2 of them with that much: start Ray on more nodes (`ray start "
        "--address=<head>:<port>` on each), or lower the pool's nnodes / n_gpus_per_node "
        "(trainer.*, or actor_rollout_ref.rollout.* for the rollout's pool)"
    ], proc.stderr[-4000:]
    assert time.monotonic() - start < 120
