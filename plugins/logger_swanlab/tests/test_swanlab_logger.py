"""The swanlab logger against real SwanLab in offline mode, read back from its run file."""

from __future__ import annotations

import glob
import os
from importlib.util import find_spec

import pytest

from polyrl.api import LoggerContext
from polyrl_logger_swanlab.logger import SwanlabLogger
from polyrl_logger_swanlab.settings import check_config

# Located, not imported: collecting this file must not load swanlab into every test process.
pytestmark = pytest.mark.skipif(find_spec("swanlab") is None, reason="pip install swanlab")

CONFIG = {"trainer": {"seed": 7}, "plugins": {}}


def _ctx(tmp_path) -> LoggerContext:
    return LoggerContext(
        project_name="proj",
        experiment_name="run-a",
        log_dir=str(tmp_path),
        total_steps=3,
        config=CONFIG,
    )


def read_records(log_dir: str) -> list[dict]:
    """Every record of the offline run file(s) under ``log_dir``, as dicts (SwanLab's own
    reader and protobuf messages)."""
    from google.protobuf.json_format import MessageToDict
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    records = []
    for path in sorted(glob.glob(os.path.join(log_dir, "run-*", "run-*.swanlab"))):
        reader = DataStoreReader()
        reader.open(path)
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            records.append(MessageToDict(record))
        reader.close()
    return records


def test_metrics_config_and_the_reward_curve_are_recorded_offline(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SWANLAB_MODE", raising=False)
    logger = SwanlabLogger(_ctx(tmp_path))
    assert logger.mode == "offline"
    for step in (1, 2, 3):
        logger.log({"critic/score/mean": 0.25 * step}, step)
    curve = tmp_path / "curve.png"
    from PIL import Image

    Image.new("RGB", (4, 4)).save(curve)
    logger.log_image("reward_curve", str(curve), 3)
    logger.finish()

    records = read_records(logger.log_dir)
    scalars = sorted(
        (int(r["scalar"]["step"]), r["scalar"]["value"]["number"])
        for r in records
        if "scalar" in r and r["scalar"]["key"] == "critic/score/mean"
    )
    assert scalars == [(1, 0.25), (2, 0.5), (3, 0.75)]
    media = [r["media"] for r in records if "media" in r]
    assert [(m["key"], m["step"]) for m in media] == [("reward_curve", "3")]
    start = next(r["start"] for r in records if "start" in r)
    assert (start["project"], start["name"], start["id"]) == ("proj", "run-a", logger.run_id)
    [config_file] = glob.glob(os.path.join(logger.log_dir, "run-*", "files", "config.yaml"))
    with open(config_file, encoding="utf-8") as fh:
        assert "seed" in fh.read()
    assert any("finish" in r for r in records)


def test_an_unknown_mode_is_one_line() -> None:
    [problem] = check_config({"plugins": {"swanlab": {"mode": "cloudy"}}})
    assert "plugins.swanlab.mode='cloudy'" in problem and "offline" in problem
