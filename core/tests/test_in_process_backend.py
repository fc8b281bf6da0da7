"""``trainer.worker_backend=in_process``: each pool's one worker in the driver's process, no Ray.

What it cannot host is refused by ``polyrl validate`` in one line each, and a run trains end to
end with Ray unreachable (``RAY_ADDRESS`` points at a closed port, so any attempt to start or
join a cluster would fail the run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polyrl.config import load_config
from polyrl.config.validate import validate_config

IN_PROCESS = ("trainer.worker_backend=in_process", "trainer.n_gpus_per_node=1")


def in_process_problems(*overrides: str) -> list[str]:
    cfg = load_config(["recipe=grpo", *IN_PROCESS, *overrides])
    return [line for line in validate_config(cfg) if "worker_backend" in line]


def test_one_colocated_worker_validates():
    assert in_process_problems() == []


def test_pools_of_one_worker_each_validate_on_the_cpu():
    split = ("actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=1")
    assert in_process_problems(*split) == []
    assert in_process_problems("+trainer.role_pools.ref=aux", "+trainer.resource_pools.aux=1") == []


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            ("trainer.n_gpus_per_node=2",),
            "trainer.nnodes 1 x trainer.n_gpus_per_node 2 = 2: use trainer.worker_backend=ray, "
            "or set trainer.nnodes=1 trainer.n_gpus_per_node=1",
        ),
        (
            ("+trainer.role_pools.ref=aux", "+trainer.resource_pools.aux=2"),
            "pool 'aux' (trainer.resource_pools.aux) = 2: use trainer.worker_backend=ray, or set "
            "trainer.resource_pools.aux=1",
        ),
        (
            (
                "actor_rollout_ref.hybrid_engine=false",
                "actor_rollout_ref.rollout.n_gpus_per_node=2",
            ),
            "actor_rollout_ref.rollout.n_gpus_per_node 2 = 2: use trainer.worker_backend=ray, or "
            "set actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node=1",
        ),
        (
            ("trainer.device=cuda", "+trainer.role_pools.ref=aux", "+trainer.resource_pools.aux=1"),
            "hosts one pool on CUDA, but the roles are placed in the pools ['aux', 'global']",
        ),
        (("trainer.max_restarts=1",), "trainer.max_restarts=0"),
    ],
)
def test_what_one_process_cannot_host_is_one_line(overrides, named):
    problems = in_process_problems(*overrides)
    assert len(problems) == 1, problems
    assert named in problems[0] and "trainer.worker_backend=ray" in problems[0], problems


def test_an_unknown_backend_is_named():
    cfg = load_config(["recipe=grpo", "trainer.worker_backend=threads"])
    lines = [line for line in validate_config(cfg) if "trainer.worker_backend" in line]
    assert len(lines) == 1 and "in_process" in lines[0] and "ray" in lines[0], lines


@pytest.mark.slow
def test_trains_and_learns_without_ray(tmp_path: Path):
    env = {
        **os.environ,
        "RAY_ADDRESS": "127.0.0.1:9",  # discard port: joining or starting a cluster would fail
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "polyrl",
        "train",
        "recipe=grpo",
        *IN_PROCESS,
        f"trainer.default_local_dir={tmp_path}",
        "trainer.logger=[jsonl]",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    val = "val-core/polyrl/tiny_digits/reward/mean@1"
    assert records[0]["step"] == 0 and records[-1]["step"] == 10
    assert records[-1][val] > records[0][val] + 0.2, (records[0][val], records[-1][val])
    assert (tmp_path / "hf_model" / "config.json").exists()
