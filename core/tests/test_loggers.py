"""Behaviour of the built-in loggers and LoggerGroup: real files, real tqdm, real event files."""

from __future__ import annotations

import io
import json
import math
import os

import numpy as np
import pytest
import torch

from polyrl.errors import ConfigError
from polyrl.interfaces.logger import LoggerContext, MetricsLogger
from polyrl.loggers import LoggerGroup
from polyrl.loggers.console import ConsoleLogger, key_figures
from polyrl.loggers.jsonl import JsonlLogger, read_metrics
from polyrl.loggers.values import to_float_metrics, val_rewards
from polyrl.registry import PluginNotFoundError, Registry, get_registry, set_registry
from polyrl.testing import LoggerConformance

torch.set_num_threads(1)


def _ctx(tmp_path, total=4, resumed=0) -> LoggerContext:
    return LoggerContext(
        project_name="p",
        experiment_name="e",
        log_dir=str(tmp_path / "run"),
        total_steps=total,
        resumed_from_step=resumed,
    )


STEP_METRICS = {
    "critic/score/mean": 0.25,
    "actor/kl_loss": 0.00125,
    "actor/ppo_kl": 0.5,  # kl_loss wins when both are present
    "response_length/mean": 87.46,
    "timing_s/step": 6.214,
}


# ---- values -----------------------------------------------------------------------------------
def test_to_float_metrics_converts_numpy_and_torch_scalars():
    out = to_float_metrics(
        {"a": np.float32(0.5), "b": torch.tensor(2.0), "c": 3, "d": True, "e": np.int64(7)}
    )
    assert out == {"a": 0.5, "b": 2.0, "c": 3.0, "d": 1.0, "e": 7.0}
    assert all(type(v) is float for v in out.values())


@pytest.mark.parametrize("bad", ["0.5", torch.ones(3), [1.0, 2.0]])
def test_to_float_metrics_rejects_non_scalars_naming_the_key(bad):
    with pytest.raises(TypeError, match="actor/pg_loss"):
        to_float_metrics({"actor/pg_loss": bad})


def test_val_rewards_per_source_prefers_smallest_n():
    metrics = {
        "val-core/gsm8k/reward/mean@1": 0.4,
        "val-core/gsm8k/reward/mean@4": 0.9,
        "val-core/openai/gsm8k/reward/mean@1": 0.1,  # data_source names may contain '/'
        "val-aux/gsm8k/reward/mean@1": 7.0,
    }
    assert val_rewards(metrics) == {"gsm8k": 0.4, "openai/gsm8k": 0.1}


# ---- console ----------------------------------------------------------------------------------
def test_key_figures_formats_the_step_figures():
    figures = dict(key_figures(STEP_METRICS))
    assert figures == {
        "reward": "0.250",
        "kl": "0.00125",
        "resp_len": "87.5",
        "s/step": "6.21",
    }
    with_val = dict(
        key_figures({"val-core/a/reward/mean@1": 0.5, "val-core/b/reward/mean@1": 0.25})
    )
    assert with_val == {"val": "0.375"}  # mean over sources: (0.5 + 0.25) / 2
    assert dict(key_figures({"actor/ppo_kl": 0.02}, last_val=0.5)) == {"kl": "0.02", "val": "0.500"}


def test_console_non_tty_writes_one_line_per_step(tmp_path):
    stream = io.StringIO()  # not a TTY -> line mode
    logger = ConsoleLogger(_ctx(tmp_path, total=4), stream=stream)
    logger.log(STEP_METRICS, 1)
    logger.log({**STEP_METRICS, "val-core/gsm8k/reward/mean@1": 0.75}, 2)
    logger.finish()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "[polyrl] step 1/4 (25%) | reward 0.250 | kl 0.00125 | resp_len 87.5 | s/step 6.21",
        "[polyrl] step 2/4 (50%) | reward 0.250 | kl 0.00125 | resp_len 87.5 | s/step 6.21 "
        "| val 0.750",
    ]
    assert "\r" not in stream.getvalue()


def test_console_bar_counts_from_resumed_step_and_shows_postfix(tmp_path):
    stream = io.StringIO()
    logger = ConsoleLogger(_ctx(tmp_path, total=10, resumed=6), stream=stream, live=True)
    assert logger._bar.n == 6 and logger._bar.total == 10
    logger.log({"val-core/x/reward/mean@1": 0.5}, 6)  # validation at the resumed step
    logger.log(STEP_METRICS, 7)
    assert logger._bar.n == 7
    logger.log(STEP_METRICS, 8)
    assert logger._bar.n == 8
    logger.finish()
    logger.finish()  # idempotent
    out = stream.getvalue()
    assert "8/10" in out
    # the postfix of the last step shows the figures and keeps the last validation reward
    assert "reward=0.250, kl=0.00125, resp_len=87.5, s/step=6.21, val=0.500" in out


def test_console_env_forces_line_mode(tmp_path, monkeypatch):
    class FakeTty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("POLYRL_PROGRESS", "lines")
    stream = FakeTty()
    logger = ConsoleLogger(_ctx(tmp_path, total=0), stream=stream)
    logger.log({"critic/score/mean": 1.0}, 3)
    logger.finish()
    assert stream.getvalue() == "[polyrl] step 3 | reward 1.000\n"


# ---- jsonl ------------------------------------------------------------------------------------
def test_jsonl_writes_one_record_per_step_with_nulls_for_non_finite(tmp_path):
    ctx = _ctx(tmp_path)
    logger = JsonlLogger(ctx)  # creates the folder
    logger.log({"a": np.float32(0.5), "b": torch.tensor(float("nan")), "c": math.inf}, 1)
    logger.log({"a": 1}, 2)
    # visible on disk before finish: fsync'd per step
    with open(os.path.join(ctx.log_dir, "metrics.jsonl")) as fh:
        raw = fh.read().splitlines()
    assert raw[0] == '{"step":1,"a":0.5,"b":null,"c":null}'
    logger.finish()
    assert read_metrics(logger.path) == [
        {"step": 1, "a": 0.5, "b": None, "c": None},
        {"step": 2, "a": 1.0},
    ]
    for line in raw:
        json.loads(line)  # strict JSON


def test_jsonl_rejects_a_metric_named_step(tmp_path):
    logger = JsonlLogger(_ctx(tmp_path))
    with pytest.raises(ValueError, match="named 'step'"):
        logger.log({"step": 3.0}, 3)
    logger.finish()


def test_jsonl_resume_drops_steps_after_checkpoint_and_partial_line(tmp_path):
    first = JsonlLogger(_ctx(tmp_path))
    for step in range(1, 6):
        first.log({"critic/score/mean": step / 10}, step)
    first.finish()
    with open(first.path, "a") as fh:  # a crash in the middle of writing step 6
        fh.write('{"step":6,"critic/sc')
    # the checkpoint was at step 3: steps 4, 5 and the torn 6 go, 1..3 stay
    resumed = JsonlLogger(_ctx(tmp_path, resumed=3))
    resumed.log({"critic/score/mean": 0.99}, 4)
    resumed.finish()
    records = read_metrics(resumed.path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[2]["critic/score/mean"] == 0.3 and records[3]["critic/score/mean"] == 0.99
    leftovers = [n for n in os.listdir(os.path.dirname(resumed.path)) if n != "metrics.jsonl"]
    assert leftovers == []  # no temp file left behind


def test_jsonl_fresh_run_moves_an_old_file_aside(tmp_path):
    old = JsonlLogger(_ctx(tmp_path))
    old.log({"x": 1.0}, 1)
    old.finish()
    new = JsonlLogger(_ctx(tmp_path))
    new.log({"x": 2.0}, 1)
    new.finish()
    assert read_metrics(new.path) == [{"step": 1, "x": 2.0}]
    aside = [n for n in os.listdir(os.path.dirname(new.path)) if n != "metrics.jsonl"]
    assert len(aside) == 1 and aside[0].startswith("metrics.") and aside[0].endswith(".jsonl")
    assert read_metrics(os.path.join(os.path.dirname(new.path), aside[0])) == [
        {"step": 1, "x": 1.0}
    ]


# ---- tensorboard ------------------------------------------------------------------------------
def _scalars(folder: str, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder)
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_writes_scalars_and_purges_after_resume(tmp_path):
    from polyrl.loggers.tensorboard import TensorboardLogger

    first = TensorboardLogger(_ctx(tmp_path))
    for step in (1, 2, 3):
        first.log({"critic/score/mean": step * 0.25}, step)
    first.finish()
    tb_dir = os.path.join(str(tmp_path / "run"), "tensorboard")
    assert _scalars(tb_dir, "critic/score/mean") == [(1, 0.25), (2, 0.5), (3, 0.75)]

    resumed = TensorboardLogger(_ctx(tmp_path, resumed=1))
    resumed.log({"critic/score/mean": 0.125}, 2)
    resumed.finish()
    # step 1 from the first run, step 2 from the resumed one; the old 2 and 3 are purged
    assert _scalars(tb_dir, "critic/score/mean") == [(1, 0.25), (2, 0.125)]


# ---- LoggerGroup ------------------------------------------------------------------------------
class _Recorder(MetricsLogger):
    calls: list = []

    def log(self, metrics, step):
        self.calls.append(("log", step, metrics))

    def finish(self):
        self.calls.append(("finish",))


class _Exploding(MetricsLogger):
    def log(self, metrics, step):
        raise OSError("disk full")


def test_group_from_names_builds_builtins_through_registry(tmp_path):
    ctx = _ctx(tmp_path)
    stream_names = ["jsonl", "jsonl"]  # duplicates collapse
    with LoggerGroup.from_names(stream_names, ctx) as group:
        assert group.names == ["jsonl"]
        group.log({"critic/score/mean": np.float64(0.5)}, 1)
    assert read_metrics(os.path.join(ctx.log_dir, "metrics.jsonl")) == [
        {"step": 1, "critic/score/mean": 0.5}
    ]
    assert group.loggers[0]._fh.closed


def test_group_unknown_name_lists_valid_ones(tmp_path):
    with pytest.raises(PluginNotFoundError, match="console"):
        LoggerGroup.from_names(["consol"], _ctx(tmp_path))
    with pytest.raises(ConfigError, match=r"trainer\.logger"):
        LoggerGroup.from_names(["console", ""], _ctx(tmp_path))


def test_group_finishes_everything_on_error_and_reraises(tmp_path):
    _Recorder.calls = []
    ctx = _ctx(tmp_path)
    group = LoggerGroup([_Exploding(ctx), _Recorder(ctx)], ["boom", "rec"])
    with pytest.raises(OSError, match="disk full") as info, group:
        group.log({"a": 1}, 1)
    assert "in logger 'boom' (log)" in info.value.__notes__
    # the second logger still got the step, and finish ran once on exit
    assert _Recorder.calls == [("log", 1, {"a": 1.0}), ("finish",)]
    group.finish()
    assert _Recorder.calls[-1] == ("finish",) and len(_Recorder.calls) == 2


def test_group_finishes_built_loggers_when_a_later_one_fails(tmp_path):
    from polyrl.hookspecs import hookimpl
    from polyrl.registry import Provenance, discover
    from polyrl.specs import LoggerSpec

    class Broken(MetricsLogger):
        def __init__(self, ctx):
            raise RuntimeError("cannot connect")

        def log(self, metrics, step):  # pragma: no cover - never built
            pass

    class Plugin:
        @hookimpl
        def polyrl_loggers(self):
            yield LoggerSpec(name="rec", description="records", logger=_Recorder)
            yield LoggerSpec(name="broken", description="fails", logger=Broken)

    _Recorder.calls = []
    previous = get_registry()
    registry: Registry = discover()
    registry.add_plugin(Plugin(), Provenance("test", "test-dist", "0"))
    set_registry(registry)
    try:
        with pytest.raises(RuntimeError, match="cannot connect"):
            LoggerGroup.from_names(["rec", "broken"], _ctx(tmp_path))
    finally:
        set_registry(previous)
    assert _Recorder.calls == [("finish",)]


# ---- reward-curve plot ------------------------------------------------------------------------
def test_plot_reward_curve_writes_png_from_jsonl(tmp_path):
    from matplotlib.image import imread

    from polyrl.errors import DataError
    from polyrl.plotting import load_reward_series, plot_reward_curve

    ctx = _ctx(tmp_path, total=4)
    with LoggerGroup([JsonlLogger(ctx)]) as group:
        group.log({"val-core/gsm8k/reward/mean@1": 0.1}, 0)  # validation before training
        for step in (1, 2, 3, 4):
            group.log({"critic/score/mean": step / 8, "actor/pg_loss": -0.1}, step)
        group.log({"critic/score/mean": math.nan}, 5)  # written as null, skipped in the plot
    path = os.path.join(ctx.log_dir, "metrics.jsonl")
    train, val = load_reward_series(path)
    assert train == [(1, 0.125), (2, 0.25), (3, 0.375), (4, 0.5)]
    assert val == {"gsm8k": [(0, 0.1)]}

    out = plot_reward_curve(path, str(tmp_path / "plots" / "reward.png"))
    assert out == str(tmp_path / "plots" / "reward.png")
    with open(out, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    pixels = imread(out)
    assert pixels.shape[:2] == (540, 960)  # 8 x 4.5 inches at 120 dpi
    # the train line is drawn in matplotlib's first colour, #1f77b4
    blue = (abs(pixels[..., 0] - 0x1F / 255) < 0.02) & (abs(pixels[..., 2] - 0xB4 / 255) < 0.02)
    assert blue.sum() > 100

    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"step": 1, "actor/pg_loss": 0.5}\n')
    with pytest.raises(DataError, match="no reward curve"):
        plot_reward_curve(str(empty), str(tmp_path / "x.png"))
    with pytest.raises(DataError, match="no metrics file"):
        plot_reward_curve(str(tmp_path / "missing.jsonl"), str(tmp_path / "x.png"))


class TestBuiltinConsoleLogger(LoggerConformance):
    plugin_name = "console"

    def check_logged(self, tmp_path, logged) -> None:
        # line mode under pytest (stderr is captured, not a TTY); nothing is written to files
        assert os.listdir(tmp_path) == []
