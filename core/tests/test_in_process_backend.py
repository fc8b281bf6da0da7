"""``trainer.worker_backend=in_process``: the run's one worker in the driver's process, no Ray.

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


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.n_gpus_per_node=2", "trainer.nnodes x trainer.n_gpus_per_node = 2"),
        ("trainer.max_restarts=1", "trainer.max_restarts=0"),
        ("+trainer.role_pools.ref=aux", "placed in the pools ['aux', 'global']"),
    ],
)
def test_what_one_process_cannot_host_is_one_line(override, named):
    extra = ("+trainer.resource_pools.aux=1",) if "role_pools" in override else ()
    problems = in_process_problems(override, *extra)
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
