"""The mlflow logger against real MLflow (mlflow-skinny), in a local file store, read back."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

from polyrl.api import LoggerContext
from polyrl_logger_mlflow.logger import MlflowLogger, flat_params, metric_name, tracking_uri
from polyrl_logger_mlflow.settings import MlflowSettings

# Located, not imported: collecting this file must not load mlflow (about a second) into every
# test process; the tests that read a run back import its client.
pytestmark = pytest.mark.skipif(find_spec("mlflow") is None, reason="pip install mlflow-skinny")


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


CONFIG = {"trainer": {"seed": 7, "logger": ["console", "mlflow"]}, "plugins": {}}


def _ctx(tmp_path, resumed_from_step: int = 0) -> LoggerContext:
    return LoggerContext(
        project_name="proj",
        experiment_name="run-a",
        log_dir=str(tmp_path),
        total_steps=4,
        config=CONFIG,
        resumed_from_step=resumed_from_step,
    )


def _history(logger: MlflowLogger, key: str) -> list[tuple[int, float]]:
    client = _client(logger.uri)
    return sorted((m.step, m.value) for m in client.get_metric_history(logger.run_id, key))


def test_metrics_config_and_the_reward_curve_are_recorded(tmp_path) -> None:
    logger = MlflowLogger(_ctx(tmp_path))
    for step in (1, 2, 3):
        logger.log({"critic/score/mean": 0.25 * step}, step)
    curve = tmp_path / "reward_curve.png"
    curve.write_bytes(b"\x89PNG\r\n\x1a\n")
    logger.log_image("reward_curve", str(curve), 3)
    logger.finish()

    client = _client(logger.uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "run-a"
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    assert _history(logger, "critic/score/mean") == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert run.data.params["trainer.seed"] == "7"
    assert [a.path for a in client.list_artifacts(logger.run_id, "images")] == [
        "images/reward_curve.png"
    ]
    assert logger.uri.startswith("file:") and (tmp_path / "mlruns").is_dir()


def test_a_resumed_training_run_continues_the_same_mlflow_run(tmp_path) -> None:
    first = MlflowLogger(_ctx(tmp_path))
    first.log({"loss": 1.0}, 1)
    first.finish()
    again = MlflowLogger(_ctx(tmp_path, resumed_from_step=1))
    again.log({"loss": 0.5}, 2)
    again.finish()
    assert again.run_id == first.run_id
    assert _history(again, "loss") == [(1, 1.0), (2, 0.5)]


def test_a_fresh_run_in_the_same_folder_is_a_new_mlflow_run(tmp_path) -> None:
    first = MlflowLogger(_ctx(tmp_path))
    first.finish()
    second = MlflowLogger(_ctx(tmp_path))
    second.finish()
    assert second.run_id != first.run_id


def test_the_tracking_uri_setting_wins_then_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://from-env:5000")
    assert tracking_uri(MlflowSettings(tracking_uri="http://set:5000"), "x") == "http://set:5000"
    assert tracking_uri(MlflowSettings(), "x") == "http://from-env:5000"


def test_the_config_becomes_dotted_parameters() -> None:
    params = dict(flat_params({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}}))
    assert params == {"a.b": "1", "a.c.d": "[1, 2]", "e": "{}"}


def test_verls_validation_names_are_written_in_mlflows_characters(tmp_path) -> None:
    key = "val-core/polyrl/tiny_digits/reward/mean@4"
    assert metric_name(key) == "val-core/polyrl/tiny_digits/reward/mean_at_4"
    logger = MlflowLogger(_ctx(tmp_path))
    logger.log({key: 0.5, "a|b": 1.0}, 1)
    logger.finish()
    assert _history(logger, metric_name(key)) == [(1, 0.5)]
    assert _history(logger, "a_b") == [(1, 1.0)]


def test_validation_samples_are_a_json_lines_artifact_per_step(tmp_path) -> None:
    import json

    logger = MlflowLogger(_ctx(tmp_path))
    row = {"step": 3, "data_source": "src", "prompt": "2+2?", "output": "4", "score": 1.0}
    logger.log_generations([row, {**row, "prompt": "3+3?"}], 3)
    logger.finish()
    client = _client(logger.uri)
    (artifact,) = client.list_artifacts(logger.run_id, "val_generations")
    assert artifact.path == "val_generations/step_00000003.jsonl"
    local = client.download_artifacts(logger.run_id, artifact.path, str(tmp_path / "down"))
    with open(local, encoding="utf-8") as fh:
        assert [json.loads(line)["prompt"] for line in fh] == ["2+2?", "3+3?"]
