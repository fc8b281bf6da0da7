"""End to end: ``polyrl train recipe=dpo`` (offline DPO on the tiny model, one worker in the
run's process) learns the preference, and a DPO run on preference parquet written by another
tool in TRL's layout trains, validates, checkpoints and resumes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_train_tiny import polyrl_train, read_records, split_records

from polyrl.data.generate import tiny_digit_pairs_rows

pytestmark = pytest.mark.slow

TRL_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins")


def train_dpo(out_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``polyrl train recipe=dpo ...``, failing with its output if it fails."""
    return polyrl_train(out_dir, "recipe=dpo", *overrides)


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dpo_recipe")
    train_dpo(out)
    return out


def test_recipe_logs_trl_metrics_every_step_and_checkpoints(recipe_run: Path) -> None:
    _, records = split_records(read_records(recipe_run))
    assert [r["step"] for r in records] == list(range(1, 31))
    for record in records:
        missing = [m for m in (*TRL_METRICS, "actor/pg_loss", "timing_s/ref") if m not in record]
        assert not missing, f"step {record['step']} lacks {missing}"
    assert (recipe_run / "global_step_30" / "actor").is_dir()
    assert (recipe_run / "hf_model" / "config.json").is_file()


def test_preference_accuracy_rises_and_the_margin_grows(recipe_run: Path) -> None:
    everything = read_records(recipe_run)
    val = {r["step"]: r for r in everything if "val-core/rewards/accuracies" in r}
    assert sorted(val) == [0, 10, 20, 30]  # 0: the validation before training
    # Before training the policy is the reference: every implicit reward is 0.
    assert val[0]["val-core/rewards/accuracies"] == 0.0
    assert val[0]["val-core/rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert val[30]["val-core/rewards/accuracies"] >= 0.8, val[30]
    margins = [val[step]["val-core/rewards/margins"] for step in (0, 10, 20, 30)]
    _, records = split_records(everything)
    assert margins[-1] > 0.5 and margins[-1] > margins[1] + 0.3, margins
    train = [r["rewards/accuracies"] for r in records]
    assert sum(train[-5:]) / 5 > sum(train[:5]) / 5 + 0.2, train
    losses = [r["actor/pg_loss"] for r in records]
    assert losses[0] == pytest.approx(0.6931, abs=1e-3)  # log 2: no preference yet
    assert sum(losses[-5:]) / 5 < 0.6, losses


def write_trl_conversational(path: Path, size: int, seed: int) -> str:
    """Pairs as TRL's conversational preference datasets hold them, written with plain pyarrow:
    ``prompt`` messages, ``chosen`` and ``rejected`` each a list of one assistant message."""
    rows = [
        {
            "prompt": row["prompt"],
            "chosen": [{"role": "assistant", "content": row["chosen"]}],
            "rejected": [{"role": "assistant", "content": row["rejected"]}],
        }
        for row in tiny_digit_pairs_rows(size=size, seed=seed, split="train")
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_trl_layout_file_trains_validates_and_resumes_with_ipo(tmp_path: Path) -> None:
    train = write_trl_conversational(tmp_path / "train.parquet", 64, seed=21)
    val = write_trl_conversational(tmp_path / "val.parquet", 8, seed=22)
    out = tmp_path / "run"
    common = (
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=8",
        # 8 rows per worker in micro-batches of 4: gradient accumulation over whole pairs
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.policy_loss.loss_mode=ipo",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
    )
    train_dpo(out, *common, "trainer.total_training_steps=2")
    resumed = train_dpo(out, *common, "trainer.total_training_steps=4")
    assert "resumed from" in resumed.stderr and "(step 2)" in resumed.stderr
    before, records = split_records(read_records(out))
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for record in records:
        assert all(name in record for name in TRL_METRICS), record
    assert before is not None
    assert before["val-aux/loss"] == pytest.approx(25.0, abs=1e-3)  # IPO: (0 - 1/(2 x 0.1))^2
    assert "val-core/rewards/accuracies" in records[-1]
    assert (out / "global_step_4" / "actor").is_dir()
