"""WandbLogger against the real wandb library in offline mode: the run folder appears, its
transaction log holds the logged history, and a resumed training run reuses the run id."""

from __future__ import annotations

import glob
import json
import os
import struct
import time

import pytest

from polyrl.errors import ConfigError
from polyrl.interfaces.logger import LoggerContext
from polyrl.loggers import LoggerGroup
from polyrl.testing import LoggerConformance
from polyrl_logger_wandb.config import WandbLoggerConfig
from polyrl_logger_wandb.logger import RUN_ID_FILE, WandbLogger, api_key_configured, resolve_mode

# ---- reading wandb's offline transaction log (run-<id>.wandb) --------------------------------
# Layout (a LevelDB-style log): a 7-byte file header ":W&B" + magic 0xBEE1 + version, then
# 32 KiB blocks of chunks, each with a 7-byte header (crc32, length u16, type u8:
# 1 full, 2 first, 3 middle, 4 last) and a serialized wandb Record protobuf as payload.
_BLOCK = 32 * 1024


def _records(path: str) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:4] == b":W&B"
    pos, records, parts = 7, [], b""
    while pos + 7 <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < 7:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        parts = payload if kind in (1, 2) else parts + payload
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            records.append(record)
    return records


def _finished_records(run_dir: str, timeout_s: float = 20.0) -> list:
    """The records of a finished offline run. wandb-core writes the file in its own process and
    may still be flushing it for a moment after ``Run.finish()`` returns (seen here: a 7-byte
    file for ~0.5 s), so wait for the ``exit`` record that ends the log."""
    (log_file,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    deadline = time.monotonic() + timeout_s
    while True:
        records = _records(log_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{log_file} has no exit record after {timeout_s} s")
        time.sleep(0.1)


def _history(run_dir: str) -> list[dict]:
    """The ``wandb.log`` rows of an offline run, as dicts with ``_step``."""
    rows = []
    for record in _finished_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            rows.append(row)
    return rows


def _config(run_dir: str) -> dict:
    for record in _finished_records(run_dir):
        if record.WhichOneof("record_type") == "run":
            return {item.key: json.loads(item.value_json) for item in record.run.config.update}
    raise AssertionError("no run record")


# ---- fixtures ----------------------------------------------------------------------------------
@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # no stdout/stderr capture inside pytest
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _ctx(tmp_path, resumed=0, config=None) -> LoggerContext:
    return LoggerContext(
        project_name="polyrl-test",
        experiment_name="tiny",
        log_dir=str(tmp_path / "run"),
        total_steps=4,
        config=config if config is not None else {"trainer": {"seed": 7}},
        resumed_from_step=resumed,
    )


# ---- tests -------------------------------------------------------------------------------------
def test_offline_run_records_history_and_config(offline, tmp_path):
    logger = WandbLogger(_ctx(tmp_path))
    assert logger.mode == "offline"
    for step in (1, 2, 3):
        logger.log({"critic/score/mean": step / 4, "actor/kl_loss": 0.5 * step}, step)
    logger.finish()
    logger.finish()  # idempotent

    run_dir = logger.run_dir
    assert os.path.basename(run_dir).startswith("offline-run-")
    assert run_dir.endswith(logger.run_id)
    assert os.path.dirname(run_dir) == str(tmp_path / "run" / "wandb")
    rows = _history(run_dir)
    assert [r["_step"] for r in rows] == [1, 2, 3]
    assert [r["critic/score/mean"] for r in rows] == [0.25, 0.5, 0.75]
    assert [r["actor/kl_loss"] for r in rows] == [0.5, 1.0, 1.5]
    assert _config(run_dir)["trainer"] == {"seed": 7}


def test_resumed_training_run_continues_the_same_wandb_run(offline, tmp_path):
    first = WandbLogger(_ctx(tmp_path))
    first.log({"critic/score/mean": 0.1}, 1)
    first.log({"critic/score/mean": 0.2}, 2)
    first.finish()
    with open(tmp_path / "run" / RUN_ID_FILE) as fh:
        assert fh.read().strip() == first.run_id

    with LoggerGroup.from_names(["wandb"], _ctx(tmp_path, resumed=2)) as group:
        group.log({"critic/score/mean": 0.3}, 3)
    resumed = group.loggers[0]
    assert resumed.run_id == first.run_id
    rows = _history(resumed.run_dir)
    assert [(r["_step"], r["critic/score/mean"]) for r in rows] == [(3, 0.3)]

    fresh = WandbLogger(_ctx(tmp_path, resumed=0))  # a new training run: a new wandb run
    fresh.finish()
    assert fresh.run_id != first.run_id


def test_mode_resolution(tmp_path):
    netrc_file = tmp_path / "netrc"
    env = {"NETRC": str(netrc_file)}
    assert not api_key_configured(env)
    assert resolve_mode(None, env) == "offline"
    assert resolve_mode("disabled", env) == "disabled"
    assert resolve_mode(None, {**env, "WANDB_API_KEY": "k" * 40}) == "online"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password secretkey\n")
    netrc_file.chmod(0o600)
    assert api_key_configured(env) and resolve_mode(None, env) == "online"
    # a self-hosted server: the key must be for that host
    assert not api_key_configured({**env, "WANDB_BASE_URL": "https://wandb.example.org"})
    # the environment variable wins over everything
    assert resolve_mode("online", {**env, "WANDB_MODE": "offline"}) == "offline"


def test_plugin_config_section():
    cfg = WandbLoggerConfig.from_run_config(
        {"plugins": {"wandb": {"entity": "team", "tags": ["a", "b"], "mode": "offline"}}}
    )
    assert (cfg.entity, cfg.tags, cfg.mode, cfg.group) == ("team", ["a", "b"], "offline", None)
    assert WandbLoggerConfig.from_run_config({}) == WandbLoggerConfig()
    with pytest.raises(ConfigError, match=r"plugins\.wandb\.entitiy.*valid keys"):
        WandbLoggerConfig.from_run_config({"plugins": {"wandb": {"entitiy": "x"}}})
    with pytest.raises(ConfigError, match="list of strings"):
        WandbLoggerConfig.from_run_config({"plugins": {"wandb": {"tags": "a"}}})
    with pytest.raises(ConfigError, match="online, offline, disabled"):
        WandbLoggerConfig.from_run_config({"plugins": {"wandb": {"mode": "cloud"}}})


def test_registered_through_the_entry_point():
    from polyrl.registry import discover
    from polyrl.specs import PluginKind

    registration = discover().get(PluginKind.LOGGER, "wandb")
    assert registration.provenance.distribution == "polyrl-logger-wandb"
    assert registration.load() is WandbLogger


class TestWandbConformance(LoggerConformance):
    """The shared logger contract, with the offline history read back."""

    plugin_name = "wandb"

    @pytest.fixture(autouse=True)
    def _offline(self, offline):
        yield

    def check_logged(self, tmp_path, logged) -> None:
        (run_dir,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
        rows = _history(run_dir)
        assert [(r["_step"], r["train/loss"]) for r in rows] == [
            (step, metrics["train/loss"]) for step, metrics in logged
        ]


def test_validation_samples_are_a_table_at_their_step(offline, tmp_path):
    logger = WandbLogger(_ctx(tmp_path))
    logger.log({"critic/score/mean": 0.5}, 2)
    row = {"step": 2, "data_source": "src", "prompt": "2+2?", "output": "4", "score": 1.0}
    logger.log_generations([row], 2)
    logger.finish()
    (record,) = _history(logger.run_dir)  # one row: the step's metrics and its table
    assert record["_step"] == 2 and record["critic/score/mean"] == 0.5
    assert record["val/generations/_type"] == "table-file"
    assert (record["val/generations/nrows"], record["val/generations/ncols"]) == (1, 5)
    with open(os.path.join(logger.run_dir, "files", record["val/generations/path"])) as fh:
        stored = json.load(fh)
    assert stored["columns"] == ["step", "data_source", "prompt", "output", "score"]
    assert stored["data"] == [[2, "src", "2+2?", "4", 1.0]]
