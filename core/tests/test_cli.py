"""The ``polyrl`` command: in-process through ``main(argv)`` and as a subprocess without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from polyrl.cli import main
from polyrl.specs import AdvantageEstimatorSpec, RolloutEngineSpec, TrainingEngineSpec
from polyrl.testing.cli import run_polyrl

BLOCKED = ("torch", "vllm", "ray", "transformers", "sglang", "megatron", "deepspeed")


@pytest.fixture
def test_plugins(isolated_registry, register_plugin):
    """Built-ins plus CPU engines and an estimator (validation only locates their modules)."""
    return register_plugin(
        [
            TrainingEngineSpec(
                name="eng",
                description="test engine",
                engine="polyrl.interfaces.training_engine:TrainingEngine",
                supports_cpu=True,
            ),
            RolloutEngineSpec(
                name="roll",
                description="test rollout",
                engine="polyrl.interfaces.rollout_engine:RolloutEngine",
                supports_cpu=True,
            ),
            AdvantageEstimatorSpec(
                name="est",
                description="test estimator",
                fn=f"{__name__}:zero_advantage",
            ),
        ],
        distribution="polyrl-cli-test",
        version="7.0",
    )


def zero_advantage(batch, config):
    """An estimator that keeps its contract (validate calls it on a synthetic batch)."""
    zeros = batch["response_mask"] * 0.0
    return zeros, zeros.clone()


@pytest.fixture
def good_overrides(tmp_path: Path) -> list[str]:
    table = pa.table(
        {
            "data_source": ["t"],
            "prompt": [[{"role": "user", "content": "hi"}]],
            "reward_model": [{"ground_truth": "x"}],
        }
    )
    pq.write_table(table, tmp_path / "train.parquet")
    (tmp_path / "model").mkdir()
    return [
        "~recipe",  # the schema's defaults: independent of what the shipped recipe sets
        f"data.train_files={tmp_path / 'train.parquet'}",
        f"actor_rollout_ref.model.path={tmp_path / 'model'}",
        "actor_rollout_ref.actor.strategy=eng",
        "actor_rollout_ref.rollout.name=roll",
        "algorithm.adv_estimator=est",
        "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]


# ---- plugins -----------------------------------------------------------------------------------
def test_plugins_json_lists_every_registration(test_plugins, capsys) -> None:
    assert main(["plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert {"console", "jsonl", "vanilla", "naive", "eng", "roll", "est"} <= set(by_name)
    eng = by_name["eng"]
    assert eng["kind"] == "training_engine"
    assert (eng["package"], eng["version"], eng["status"]) == ("polyrl-cli-test", "7.0", "ok")
    assert eng["capabilities"]["cpu"] is True and eng["capabilities"]["lora"] is False
    assert eng["description"] == "test engine"
    assert by_name["console"]["package"] == "polyrl"


def test_plugins_kind_filter(test_plugins, capsys) -> None:
    assert main(["plugins", "--json", "--kind", "rollout_engine"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["roll"]


def test_plugins_table(test_plugins, capsys) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "NAME", "KIND", "PACKAGE", "VERSION", "STATUS", "CAPABILITIES", "DESCRIPTION",
    ]  # fmt: skip
    eng = next(line for line in out if line.startswith("eng "))
    assert eng.split()[:6] == [
        "eng", "training_engine", "polyrl-cli-test", "7.0", "ok",
        "cpu,cuda,weight_sync,checkpoint",
    ]  # fmt: skip


def test_bad_kind_is_a_usage_error(capsys) -> None:
    assert main(["plugins", "--kind", "engine"]) == 2
    assert "invalid choice: 'engine'" in capsys.readouterr().err


# ---- validate / config -------------------------------------------------------------------------
def test_validate_good_config(test_plugins, good_overrides, capsys) -> None:
    assert main(["validate", *good_overrides]) == 0
    out = capsys.readouterr().out
    assert "config OK" in out
    assert "batch: 8 prompts x n=2 = 16 responses per step" in out
    # the algorithm (est has none of its own: the built-in step), its stages and placement
    assert "algorithm: policy_gradient (package polyrl " in out
    assert "\nstep:\n  gen [rollout]: " in out and "\n  update_actor [actor]: " in out
    assert "placement: rollout, actor -> global (1 worker(s))" in out


def test_validate_bad_config_prints_every_problem(test_plugins, good_overrides, capsys) -> None:
    code = main(
        [
            "validate",
            *good_overrides,
            "actor_rollout_ref.actor.optim.lr=-1",
            "data.train_batch_size=6",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "config is invalid (2 problem(s)):"
    assert err[1].startswith("  - actor_rollout_ref.actor.optim.lr=-1.0 is out of range")
    assert err[2].startswith("  - data.train_batch_size 6 is not divisible")


def test_misspelled_key_is_one_error_line_and_exit_2(capsys) -> None:
    assert main(["validate", "actor_rollout_ref.rollout.temprature=1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: unknown config key 'actor_rollout_ref.rollout.temprature'. Did you mean "
        "'actor_rollout_ref.rollout.temperature'? Run `polyrl config` to see every key.\n"
    )


def test_config_prints_resolved_yaml(capsys) -> None:
    assert main(["config", "trainer.project_name=demo", "trainer.experiment_name=e1"]) == 0
    out = capsys.readouterr().out
    assert "project_name: demo" in out
    assert "default_local_dir: checkpoints/demo/e1" in out  # interpolation resolved


def test_plugin_section_override_needs_no_plus(capsys) -> None:
    assert main(["config", "plugins.mything.depth=3"]) == 0
    assert "mything:\n    depth: 3" in capsys.readouterr().out


# ---- train / data wiring -----------------------------------------------------------------------
def test_train_calls_the_trainer_entry(monkeypatch) -> None:
    import polyrl.trainer.main as trainer_main

    seen: list[list[str]] = []
    monkeypatch.setattr(trainer_main, "train_from_overrides", lambda o: seen.append(o) or 0)
    assert main(["train", "trainer.total_training_steps=1", "recipe=quickstart"]) == 0
    assert seen == [["trainer.total_training_steps=1", "recipe=quickstart"]]


def test_broken_data_module_breaks_only_polyrl_data(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "polyrl.data.commands", None)  # import raises ImportError
    assert main(["data", "anything"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `polyrl data` is unavailable: polyrl.data.commands failed")
    assert main(["plugins", "--json"]) == 0


def test_data_subcommand_comes_from_the_data_module(capsys) -> None:
    pytest.importorskip("polyrl.data.commands")
    assert main(["data", "--help"]) == 0
    assert "usage: polyrl data" in capsys.readouterr().out


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("polyrl 0.1.0")


# ---- without torch -----------------------------------------------------------------------------
@pytest.fixture
def no_torch_env(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH shadows torch & co with packages whose import fails."""
    for name in BLOCKED:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('{name} is not importable in this test')\n"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYRL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    return env


def test_shadow_really_blocks_torch(no_torch_env) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import torch"],
        capture_output=True,
        text=True,
        env=no_torch_env,
        check=False,
    )
    assert "torch is not importable in this test" in done.stderr


def test_plugins_lists_without_torch(no_torch_env) -> None:
    done = run_polyrl(no_torch_env, "plugins", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert {"console", "jsonl", "tensorboard", "vanilla", "naive"} <= {r["name"] for r in rows}
    # no installed plugin's entry-point module may need torch & co to be listed
    heavy = [
        r
        for r in rows
        if r["kind"] is None and "is not importable in this test" in (r["error"] or "")
    ]
    assert heavy == [], f"entry-point modules that import heavy libraries: {heavy}"
    # implementations are resolved: one that needs torch cannot load here, and says so
    vanilla = next(r for r in rows if r["name"] == "vanilla")
    assert vanilla["status"] == "broken" and "torch is not importable" in vanilla["error"]
    # engines are only located, not imported
    engines = [r for r in rows if r["kind"] in ("training_engine", "rollout_engine")]
    assert all(r["status"] == "ok" for r in engines), engines
    table = run_polyrl(no_torch_env, "plugins")
    assert table.returncode == 0 and table.stdout.startswith("NAME")


def test_validate_and_config_without_torch(no_torch_env, good_overrides) -> None:
    done = run_polyrl(no_torch_env, "validate", *good_overrides)
    # the test engines are not installed in the subprocess: validation fails cleanly, no traceback
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "actor_rollout_ref.actor.strategy: unknown training_engine 'eng'" in done.stderr
    done = run_polyrl(no_torch_env, "config", "trainer.device=cpu")
    assert done.returncode == 0, done.stderr
    assert "device: cpu" in done.stdout


def test_unquoted_special_value_explains_quoting(capsys) -> None:
    assert main(["config", "data.train_files=builtin:x?train_size=5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot parse an override")
    assert "must be quoted" in err
