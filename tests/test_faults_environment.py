"""Never hang on the environment, and listen on loopback only: each fault ends in bounded time
with one line naming the cause (real processes, real Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

TRAIN = [sys.executable, "-m", "polyrl", "train", "recipe=tiny", "trainer.val_before_train=false",
         "trainer.total_training_steps=1"]  # fmt: skip

# Ray, two workers in a gloo group joined as polyrl's workers join theirs, then what the process
# tree listens on.
LISTEN_SCRIPT = """
import json, os
from datetime import timedelta
import torch.distributed as dist
from polyrl.workers.rendezvous import rendezvous_store
from polyrl.workers.worker_group import WorkerGroup, ensure_ray
from polyrl.testing.network import non_loopback_listeners

class Peer:
    def __init__(self, rank, world_size, master_addr, master_port):
        store = rendezvous_store(master_addr, master_port, rank, world_size, timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        self.addr = master_addr
    def ready(self):
        dist.barrier()
        return self.addr

ensure_ray(num_cpus=2)
group = WorkerGroup(Peer, world_size=2, device="cpu", init_kwargs={}, cpus_per_worker=0.5)
print(json.dumps(non_loopback_listeners(os.getpid())))
group.shutdown()
"""


def _run(args: list[str], timeout: float, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env},
        check=False,
    )  # fmt: skip
    return done, time.monotonic() - start


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def test_the_local_ray_cluster_and_torch_distributed_listen_on_loopback_only():
    done, _ = _run([sys.executable, "-c", LISTEN_SCRIPT], timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_an_unreachable_ray_address_is_one_line_naming_it(tmp_path):
    done, elapsed = _run(
        [*TRAIN, f"trainer.default_local_dir={tmp_path}"], timeout=120, RAY_ADDRESS="127.0.0.1:1"
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert _last_line(done.stderr).startswith(
        "error: cannot reach the Ray cluster at RAY_ADDRESS=127.0.0.1:1 within 15 s"
    )
    assert "unset RAY_ADDRESS" in _last_line(done.stderr)
    assert elapsed < 60


def test_a_malformed_ray_address_says_what_is_expected(monkeypatch):
    from polyrl.errors import PolyrlError
    from polyrl.workers.worker_group import ensure_ray

    monkeypatch.setenv("RAY_ADDRESS", "no-port-here")
    with pytest.raises(PolyrlError, match=r"RAY_ADDRESS='no-port-here' is not host:port"):
        ensure_ray()


def test_gpus_asked_on_a_machine_without_any_fail_at_once(tmp_path):
    done, elapsed = _run(
        [*TRAIN, "trainer.device=cuda", f"trainer.default_local_dir={tmp_path}"], timeout=300
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert _last_line(done.stderr) == (
        "error: pool 'global' needs 2 GPU but this machine's Ray cluster has 0: set "
        "trainer.device=cpu, or lower trainer.n_gpus_per_node / trainer.nnodes / "
        "trainer.resource_pools"
    )
    assert "Traceback" not in done.stderr
    assert elapsed < 100  # was 120 s of waiting for the placement group, plus start-up


def test_sigterm_while_ray_starts_is_one_line_143_and_leaves_no_process(tmp_path):
    proc = subprocess.Popen(
        [*TRAIN, f"trainer.default_local_dir={tmp_path}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    driver = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    started: list[psutil.Process] = []
    while time.monotonic() < deadline and proc.poll() is None:
        started = driver.children(recursive=True)
        if any(p.name() == "gcs_server" for p in started):  # ray.init under way
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr[-3000:]
    assert _last_line(stderr).startswith("polyrl: stopped by SIGTERM;")
    assert "Traceback" not in stderr
    _, alive = psutil.wait_procs(started, timeout=20)
    assert alive == []
    assert not Path(tmp_path, "polyrl.lock").exists()
