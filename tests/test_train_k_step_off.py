"""End to end: k-step off-policy training (``trainer.async_mode=k_step_off``, k=3) on
``recipe=grpo`` with split placement on CPU: 1 trainer and 1 rollout worker, each in a pool of
its own, hosted in the run's process (``trainer.worker_backend=in_process``; the scheduling is
the driver's, the weights cross the pools over the transport channel as between processes, and
test_split_placement.py runs split placement over Ray).

A k-step run learns as a synchronous one does (the same final validation reward within noise)
with every sample at most k versions behind; a k-step run whose driver is killed -9 mid-round
and restarted with ``trainer.resume_mode=auto`` trains every prompt exactly once per epoch, no
sample (uid) in two steps, the batches its checkpoint held ahead with their own uids, and ends
bitwise equal to the uninterrupted run.

With partial rollouts (``trainer.off_policy.partial_rollout=continue``, chunks of 4 tokens) the
weights reach the rollout after every update, between chunks: such a run learns as the
synchronous one does with every token at most k versions behind, and a kill -9 followed by a
resume trains every prompt once and every sample (uid) in one step, the samples its checkpoint
held half done among them (where a sync falls depends on timing, so not bitwise).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train_tiny import final_weights, read_records

from polyrl.api.testing import IN_PROCESS_OVERRIDES

pytestmark = pytest.mark.slow

K = 3
PROMPTS = 32  # batches of 8: 4 steps per epoch
STEPS = 10  # rounds of steps 2-4, 5-7, 8-10: none reaches past the last step
SPLIT = (
    *IN_PROCESS_OVERRIDES,
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
    f'data.train_files="builtin:tiny_digits?train_size={PROMPTS}"',
    f"trainer.total_training_steps={STEPS}",
    "trainer.save_freq=2",
    f"trainer.test_freq={STEPS}",
)
K_STEP = (
    *SPLIT,
    "trainer.async_mode=k_step_off",
    f"trainer.off_policy.max_off_policy_threshold={K}",
)
PARTIAL = (
    *K_STEP,
    "trainer.off_policy.partial_rollout=continue",
    "trainer.off_policy.partial_rollout_chunk_tokens=4",
)
VAL = "val-core/polyrl/tiny_digits/reward/mean@1"

# polyrl.train in a script, with a spy that records what each finished step trained on (it
# calls the trainer's step unchanged): dataset indices, sample uids and generating versions.
SCRIPT = """
import json, sys

import polyrl
from polyrl.trainer import trainer

record, real_step = open(sys.argv[2], "a"), trainer.RLTrainer._run_step


def recorded_step(self, step):
    state = real_step(self, step)
    batch = state.batch
    entry = {
        "step": step,
        "index": sorted({int(i) for i in batch["index"]}),
        "uid": sorted({str(u) for u in batch["uid"]}),
        "version": sorted({int(v) for v in batch.get("policy_version", [])}),
        "token_version": sorted({int(v) for v in tokens[tokens >= 0].unique()})
        if (tokens := batch.get("token_policy_version")) is not None else [],
    }
    record.write(json.dumps(entry) + "\\n")
    record.flush()
    return state


trainer.RLTrainer._run_step = recorded_step
polyrl.train(["recipe=grpo", f"trainer.default_local_dir={sys.argv[1]}", *sys.argv[3:]])
"""


def spied_train(tmp: Path, out: Path, steps_file: Path, *overrides: str) -> subprocess.Popen:
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    log = open(tmp / f"{out.name}.log", "a")  # noqa: SIM115 - the process writes it
    return subprocess.Popen(
        [sys.executable, str(script), str(out), str(steps_file), *overrides],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def finish(proc: subprocess.Popen, log: Path, timeout: int = 240) -> None:
    try:
        code = proc.wait(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0, log.read_text()[-6000:]


def steps_of(steps_file: Path) -> dict[int, list[dict]]:
    trained: dict[int, list[dict]] = collections.defaultdict(list)
    for line in steps_file.read_text().splitlines():
        entry = json.loads(line)
        trained[entry["step"]].append(entry)
    return trained


@pytest.fixture(scope="module")
def k_step_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("k_step_off")
    out, steps_file = tmp / "run", tmp / "steps.jsonl"
    finish(spied_train(tmp, out, steps_file, *K_STEP), tmp / "run.log")
    return out, steps_file


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A partial-rollout run killed -9 after step 7 and resumed."""
    tmp = tmp_path_factory.mktemp("partial")
    return killed_and_resumed(tmp, PARTIAL)


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sync")
    out = tmp / "run"
    finish(spied_train(tmp, out, tmp / "steps.jsonl", *SPLIT), tmp / "run.log")
    return out


def test_k_step_learns_with_every_sample_at_most_k_versions_behind(k_step_run) -> None:
    out, steps_file = k_step_run
    records = [r for r in read_records(out) if r["step"] > 0]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    # step 1 its own batch; then rounds of 3 batches by one version: 1, 2, 3 behind
    assert [r["async/staleness/max"] for r in records] == [0.0] + [1.0, 2.0, 3.0] * 3
    assert max(r["async/staleness/max"] for r in records) <= K
    assert [r["async/policy_version"] for r in records] == [float(s) for s in range(STEPS)]
    versions = [entry[0]["version"] for _, entry in sorted(steps_of(steps_file).items())]
    assert versions == [[0], [0], [0], [0], [3], [3], [3], [6], [6], [6]]
    before, after = read_records(out)[0][VAL], records[-1][VAL]
    assert after > before + 0.3, f"validation reward {before} -> {after}"


def test_partial_rollouts_learn_with_every_token_at_most_k_versions_behind(partial_run) -> None:
    out, steps_file = partial_run
    records = {r["step"]: r for r in read_records(out)}  # the last record of each step
    assert sorted(records) == list(range(STEPS + 1))
    for step in range(1, STEPS + 1):  # samples (their oldest token) and tokens, within k
        r = records[step]
        assert 0 <= r["async/token_staleness/max"] <= r["async/staleness/max"] <= K, r
        assert r["async/partial/chunks"] >= 1 and r["async/policy_version"] == step - 1
    for step, runs in steps_of(steps_file).items():  # batch s is trained by version s-1
        versions = runs[-1]["token_version"]
        assert versions and step - 1 - K <= min(versions) <= max(versions) <= step - 1, step
    before, after = records[0][VAL], records[STEPS][VAL]
    assert after > before + 0.3, f"validation reward {before} -> {after}"


def test_a_partial_run_killed_mid_round_trains_every_prompt_once(partial_run) -> None:
    assert_every_prompt_once(*partial_run)


@pytest.mark.parametrize("mode", ["k_step", "partial"])
def test_async_reaches_the_validation_reward_of_sync(
    mode: str, request: pytest.FixtureRequest, sync_run: Path
) -> None:
    run = request.getfixturevalue(f"{mode}_run")[0]
    reached, sync = read_records(run)[-1][VAL], read_records(sync_run)[-1][VAL]
    assert abs(reached - sync) <= 0.15, f"{mode} {reached} vs sync {sync}"


def test_a_driver_killed_mid_round_resumes_every_prompt_once(k_step_run, tmp_path: Path) -> None:
    quick = (*K_STEP, "trainer.val_before_train=false", "trainer.test_freq=-1")
    out, steps_file = killed_and_resumed(tmp_path, quick)
    assert_every_prompt_once(out, steps_file)
    a, b = final_weights(k_step_run[0]), final_weights(out)
    different = [name for name in a if not (a[name] == b[name]).all()]
    assert a.keys() == b.keys() and not different, f"weights differ after resume: {different[:5]}"


def killed_and_resumed(tmp: Path, overrides: tuple[str, ...]) -> tuple[Path, Path]:
    """A run killed -9 once 7 steps are done, then resumed with ``trainer.resume_mode=auto``."""
    out, steps_file, log = tmp / "run", tmp / "steps.jsonl", tmp / "run.log"
    proc = spied_train(tmp, out, steps_file, *overrides)
    try:
        deadline = time.monotonic() + 240
        # after step 5 the checkpoint of step 4 holds nothing ahead, that of step 6 holds 7
        # (k-step; partial rollouts: 7-9, finished or half done)
        while time.monotonic() < deadline and len(steps_of(steps_file) if steps_file.exists()
                                                  else {}) < 7:  # fmt: skip
            assert proc.poll() is None, log.read_text()[-4000:]
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert max(steps_of(steps_file)) < STEPS, "the run finished before it was killed"
    finish(spied_train(tmp, out, steps_file, *overrides, "trainer.resume_mode=auto"), log)
    assert "resumed from" in log.read_text()
    return out, steps_file


def assert_every_prompt_once(out: Path, steps_file: Path) -> None:
    """Every step logged, every prompt once per epoch, no sample (uid) in two steps, a step
    trained again (after the kill) on the same prompts and, for step 7, the same samples."""
    records = [r for r in read_records(out) if r["step"] > 0]
    assert sorted({r["step"] for r in records}) == list(range(1, STEPS + 1))
    assert max(r["async/staleness/max"] for r in records) <= K
    trained = steps_of(steps_file)
    final = {step: runs[-1] for step, runs in trained.items()}
    for epoch_start in (1, 5):  # epochs 1 and 2 (steps 1-4, 5-8); the third is partial
        indices = [i for s in range(epoch_start, epoch_start + 4) for i in final[s]["index"]]
        assert sorted(indices) == list(range(PROMPTS)), (epoch_start, sorted(indices))
    uids = [u for entry in final.values() for u in entry["uid"]]
    assert len(uids) == len(set(uids)), "a sample trained in two steps"
    for step, runs in trained.items():  # a step trained again trained the same prompts
        assert all(run["index"] == runs[0]["index"] for run in runs), (step, runs)
    # the batch of step 7 was drawn (k-step: generated) ahead before the step-6 checkpoint:
    # resumed, not drawn again, so its samples are the same ones (uuid4 uids are never drawn
    # twice)
    if len(trained[7]) > 1:
        assert trained[7][0]["uid"] == trained[7][-1]["uid"]
