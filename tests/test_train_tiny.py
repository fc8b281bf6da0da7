"""End to end: ``polyrl train recipe=tiny`` as a user runs it.

The learning run is the real path over Ray with the recipe's 2 CPU workers: the CLI composes
and validates the config, the controller starts Ray actors in a placement group, FSDP2 trains
over gloo, the HF rollout samples, GRPO computes advantages, rewards are scored in worker
processes, checkpoints are written. The resume and placement tests, and the other files' runs
through :func:`polyrl_train`, train one worker per pool in the run's own process
(``trainer.worker_backend=in_process``): their point is not Ray, and Ray's start-up would be
most of their time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here

pytestmark = pytest.mark.slow

REQUIRED_METRICS = (
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "response_length/mean",
    "response_length/clip_ratio",
    "actor/pg_loss",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "actor/lr",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/update_weights",
    "timing_s/step",
    "perf/throughput",
)


def polyrl_train(
    out_dir: Path, *overrides: str, timeout: int = 900, over_ray: bool = False
) -> subprocess.CompletedProcess:
    """Run ``polyrl train recipe=tiny ...`` and fail with its output if it fails.

    ``over_ray``: ``python -m polyrl`` with the recipe's 2 workers over Ray, for the tests of
    that path; otherwise one worker (``IN_PROCESS_OVERRIDES``) trained inside this test process
    (``run_polyrl_here``), for tests whose point is the algorithm, the checkpoints or the
    outputs: the interpreter's start-up and imports are most of a short run."""
    args = ["train", "recipe=tiny", f"trainer.default_local_dir={out_dir}", *overrides]
    if over_ray:
        cmd = [sys.executable, "-m", "polyrl", *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    else:
        proc = run_polyrl_here(*args[:2], *IN_PROCESS_OVERRIDES, *args[2:])
    assert proc.returncode == 0, (
        f"{' '.join(proc.args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    )
    return proc


def read_records(out_dir: Path) -> list[dict]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def split_records(records: list[dict]) -> tuple[dict | None, list[dict]]:
    """``(validation before training, training steps)``: the record of step 0, which holds the
    validation before training and nothing else (None when it did not run), and the records of
    steps 1, 2, ..."""
    before = [r for r in records if r["step"] == 0]
    steps = [r for r in records if r["step"] > 0]
    assert len(before) <= 1, f"{len(before)} records of step 0"
    if before:
        extra = [
            k for k in before[0] if k != "step" and not k.startswith(("val-core/", "val-aux/"))
        ]
        assert not extra, f"the validation-before-training record holds {extra}"
    return (before[0] if before else None), steps


def final_weights(out_dir: Path) -> dict:
    files = sorted((out_dir / "hf_model").glob("*.safetensors"))
    assert files, f"no exported model in {out_dir / 'hf_model'}"
    weights = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def train_straight_and_resumed(tmp_path: Path, steps: tuple[str, ...]) -> tuple[list, list]:
    """4 steps in one run, and 2 + 2 with a resume in between: the exported weights must be
    bitwise equal. Returns the records of both runs."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    polyrl_train(straight, "trainer.total_training_steps=4", *steps)
    polyrl_train(resumed, "trainer.total_training_steps=2", *steps)
    second = polyrl_train(resumed, "trainer.total_training_steps=4", *steps)
    assert "resumed from" in second.stderr
    a, b = final_weights(straight), final_weights(resumed)
    assert a.keys() == b.keys()
    different = [name for name in a if not (a[name] == b[name]).all()]
    assert not different, f"weights differ after resume: {different[:5]}"
    return read_records(straight), read_records(resumed)


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny_learning")
    polyrl_train(
        out,
        "trainer.total_training_steps=24",
        "trainer.save_freq=12",
        "trainer.export_hf_every_save=true",
        "trainer.log_val_generations=2",
        over_ray=True,
    )
    return out


def test_run_writes_one_record_per_step_with_verl_metric_names(learning_run: Path) -> None:
    before, records = split_records(read_records(learning_run))
    assert before is not None and any(key.startswith("val-core/") for key in before)
    assert [r["step"] for r in records] == list(range(1, 25))
    for record in records:
        missing = [name for name in REQUIRED_METRICS if name not in record]
        assert not missing, f"step {record['step']} lacks {missing}"
    assert any(key.startswith("val-core/") for key in records[-1])


def test_validation_samples_are_logged_beside_the_metrics(learning_run: Path) -> None:
    """trainer.log_val_generations=2: two samples per validation, the same prompts each time."""
    validated = [
        r["step"] for r in read_records(learning_run) if "val-aux/response_length/mean" in r
    ]
    lines = (learning_run / "val_generations.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert sorted({r["step"] for r in rows}) == validated and len(rows) == 2 * len(validated)
    for row in rows:
        assert isinstance(row["prompt"], str) and row["prompt"]
        assert isinstance(row["output"], str) and isinstance(row["score"], float)
    prompts = {step: [r["prompt"] for r in rows if r["step"] == step] for step in validated}
    assert len({tuple(p) for p in prompts.values()}) == 1, prompts


def test_grpo_raises_the_mean_reward(learning_run: Path) -> None:
    scores = [r["critic/score/mean"] for r in split_records(read_records(learning_run))[1]]
    first, last = sum(scores[:6]) / 6, sum(scores[-6:]) / 6
    assert last > first + 0.1, f"reward did not rise: first steps {scores[:6]}, last {scores[-6:]}"


def test_checkpoints_plot_and_export_are_written(learning_run: Path) -> None:
    assert (learning_run / "global_step_12").is_dir()
    assert (learning_run / "global_step_24").is_dir()
    assert (learning_run / "latest_checkpointed_iteration.txt").read_text().strip() == "24"
    assert (learning_run / "reward_curve.png").stat().st_size > 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(learning_run / "hf_model")
    tokenizer = AutoTokenizer.from_pretrained(learning_run / "hf_model")
    assert model.config.vocab_size >= len(tokenizer) - 1


def test_every_checkpoint_holds_its_hugging_face_export(learning_run: Path) -> None:
    """trainer.export_hf_every_save: step 24's folder holds the final weights exactly (the end
    of run export's), step 12's other ones; both load in transformers."""
    from transformers import AutoModelForCausalLM

    def weights(folder: Path) -> dict:
        return AutoModelForCausalLM.from_pretrained(folder).state_dict()

    final = weights(learning_run / "hf_model")
    last = weights(learning_run / "global_step_24" / "hf_model")
    middle = weights(learning_run / "global_step_12" / "hf_model")
    assert final.keys() == last.keys() == middle.keys()
    assert all((final[k] == last[k]).all() for k in final)
    assert any(not (final[k] == middle[k]).all() for k in final)


def test_resume_continues_bitwise_like_an_uninterrupted_run(tmp_path: Path) -> None:
    """Off-policy updates (2 epochs x 2 shuffled mini-batches) make the driver's mini-batch plan,
    the old log-prob pass and the per-step shuffle part of what must resume exactly."""
    steps = (
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.shuffle=true",
    )
    straight_records, resumed_records = train_straight_and_resumed(tmp_path, steps)
    resumed = tmp_path / "resumed"
    assert [r["step"] for r in resumed_records] == [1, 2, 3, 4]
    for x, y in zip(straight_records[2:], resumed_records[2:]):
        assert x["critic/score/mean"] == y["critic/score/mean"]
    assert all(r["actor/optimizer_steps"] == 4 for r in straight_records)

    # Resuming that run with another rollout.n would be another experiment: refused, before Ray.
    changed = run_polyrl_here(
        "train", "recipe=tiny", *IN_PROCESS_OVERRIDES, *steps,
        f"trainer.default_local_dir={resumed}", "trainer.total_training_steps=5",
        "actor_rollout_ref.rollout.n=8",
    )  # fmt: skip
    assert changed.returncode == 2, changed.stderr[-2000:]
    assert "actor_rollout_ref.rollout.n: 4 -> 8 (run-defining)" in changed.stderr
    assert "Started a local Ray instance" not in changed.stderr


def test_reference_on_its_own_pool_trains_like_the_colocated_one(tmp_path: Path) -> None:
    """Placement is config: the reference role on a separate 1-worker pool gives the same run
    (the same samples, rewards and KL) as the reference colocated with the actor. Both in this
    process, one worker per pool; the placement of plugin roles on pools of their own over Ray
    is algo_distill's and reward_judge's test."""
    steps = (
        "trainer.total_training_steps=2",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.export_hf_model=false",
    )
    colocated, split = tmp_path / "colocated", tmp_path / "split"
    polyrl_train(colocated, *steps)
    polyrl_train(
        split, *steps, "trainer.role_pools.ref=refpool", "trainer.resource_pools.refpool=1"
    )
    for x, y in zip(read_records(colocated), read_records(split), strict=True):
        assert x["critic/score/mean"] == y["critic/score/mean"]
        assert x["actor/kl_loss"] == pytest.approx(y["actor/kl_loss"], abs=1e-6)
        assert x["actor/pg_loss"] == pytest.approx(y["actor/pg_loss"], abs=1e-6)
