"""``trainer.logger=[console,jsonl,mlflow,swanlab]`` in a real run: both tracking services'
local records (an MLflow file store, a SwanLab offline run) hold every step's reward, the config
and the reward curve, read back with their own readers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "plugins" / "logger_swanlab" / "tests")
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(m) for m in ("mlflow", "swanlab")),
        reason="needs polyrl-logger-mlflow and polyrl-logger-swanlab",
    ),
]
STEPS = 2


def test_a_run_is_recorded_by_mlflow_and_swanlab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient
    from test_swanlab_logger import read_records
    from test_train_tiny import polyrl_train
    from test_train_tiny import read_records as read_jsonl

    polyrl_train(
        tmp_path,
        "trainer.logger=[console,jsonl,mlflow,swanlab]",
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false",
        timeout=600,
    )
    rewards = {r["step"]: r["critic/score/mean"] for r in read_jsonl(tmp_path)}
    assert sorted(rewards) == list(range(1, STEPS + 1))

    # MLflow 3 reads a file store only with this switch (the logger sets it in the run's process)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    run_id = (tmp_path / "mlflow_run_id.txt").read_text().strip()
    history = {m.step: m.value for m in client.get_metric_history(run_id, "critic/score/mean")}
    assert history == pytest.approx(rewards)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["actor_rollout_ref.rollout.n"] == "4"
    assert [a.path for a in client.list_artifacts(run_id, "images")] == ["images/reward_curve.png"]

    records = read_records(str(tmp_path / "swanlog"))
    scalars = {
        int(r["scalar"]["step"]): r["scalar"]["value"]["number"]
        for r in records
        if "scalar" in r and r["scalar"]["key"] == "critic/score/mean"
    }
    assert scalars == pytest.approx(rewards)
    assert [m["media"]["key"] for m in records if "media" in m] == ["reward_curve"]
