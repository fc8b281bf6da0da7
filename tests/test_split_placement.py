"""End to end: the rollout on a pool of its own (``actor_rollout_ref.hybrid_engine=false``) over
Ray on CPU, its weights sent from the trainer's pool over a gloo channel after every update.

The failure runs inject their fault through ``polyrl.workers.transport.FAULT_ENV`` (a test hook,
not a config key) and check that a dead or stuck rollout worker ends the run with one clear
error line, exit status 2, in bounded time instead of a hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train_tiny import polyrl_train, read_records

from polyrl.workers.transport import FAULT_ENV

pytestmark = pytest.mark.slow

SPLIT = (
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "trainer.n_gpus_per_node=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
)


def test_split_placement_learns_with_a_verified_sync_every_step(tmp_path: Path) -> None:
    polyrl_train(tmp_path, *SPLIT, "trainer.total_training_steps=24", over_ray=True)
    records = read_records(tmp_path)
    assert [r["weight_sync/version"] for r in records] == list(range(1, 25))
    # fp32 on both sides: the rollout runs exactly the trainer's weights
    assert max(r["weight_sync/probe_logprob_max_diff"] for r in records) < 1e-4
    assert all(r["weight_sync/bytes"] > 0 for r in records)
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:6]) / 6, sum(scores[-6:]) / 6
    assert last > first + 0.1, f"reward did not rise: first steps {scores[:6]}, last {scores[-6:]}"


def failing_run(out_dir: Path, fault: str, *overrides: str) -> tuple[str, float]:
    """A split run whose rollout worker has ``fault`` during the first sync: its error line and
    the seconds the whole command took (start-up included)."""
    out = f"trainer.default_local_dir={out_dir}"
    cmd = [sys.executable, "-m", "polyrl", "train", "recipe=tiny", *SPLIT, out,
           "trainer.total_training_steps=3", *overrides]  # fmt: skip
    env = {**os.environ, FAULT_ENV: fault, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-4000:]
    return errors[0], elapsed


def test_a_rollout_worker_killed_mid_sync_ends_the_run(tmp_path: Path) -> None:
    line, elapsed = failing_run(
        tmp_path, "exit", "actor_rollout_ref.rollout.update_weights_bucket_megabytes=1"
    )
    assert line.startswith(
        "error: weight sync v1 actor (pool 'global', 1 rank(s)) -> rollout (pool 'rollout', "
        "1 rank(s)) failed:"
    )
    assert "worker rank 0 of pool 'rollout' failed in 'receive_weights': ActorDiedError" in line
    assert elapsed < 300, f"the run took {elapsed:.0f} s to fail"


def test_a_sync_that_never_completes_times_out_naming_the_ranks(tmp_path: Path) -> None:
    line, elapsed = failing_run(
        tmp_path, "hang", "actor_rollout_ref.rollout.weight_sync.timeout_s=5"
    )
    assert line.startswith("error: weight sync v1 actor (pool 'global', 1 rank(s)) -> rollout")
    assert (
        "worker call 'receive_weights' in pool 'rollout' did not finish within 5.0 s on ranks [0]"
        in line
    )
    assert "(timeout actor_rollout_ref.rollout.weight_sync.timeout_s=5)" in line
    assert elapsed < 300, f"the run took {elapsed:.0f} s to fail"
