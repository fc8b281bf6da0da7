"""Pre-flight in the driver: a selected plugin whose dependency is missing is one line with the
install command, before Ray starts (not a traceback from inside a worker)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from polyrl.errors import PolyrlError
from polyrl.preflight import install_command, module_available, preflight
from polyrl.specs import (
    AdvantageEstimatorSpec,
    LoggerSpec,
    RolloutEngineSpec,
    TrainingEngineSpec,
)

NO_SUCH_MODULE = "polyrl_preflight_test_no_such_module"


def _cfg(**overrides: str) -> object:
    """A config selecting the test plugins registered by ``plugins`` plus core's built-ins."""
    base = {
        "actor_rollout_ref": {
            "actor": {"strategy": "eng", "policy_loss": {"loss_mode": "vanilla"}},
            "rollout": {"name": "roll"},
        },
        "algorithm": {"name": None, "adv_estimator": "est"},
        "reward_model": {"reward_manager": "naive"},
        "trainer": {"logger": ["console", "jsonl"], "device": "cpu"},
    }
    cfg = OmegaConf.create(base)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


@pytest.fixture
def plugins(isolated_registry, register_plugin):
    return register_plugin(
        [
            TrainingEngineSpec(
                name="eng",
                description="test engine",
                engine="polyrl.interfaces.training_engine:TrainingEngine",
                runtime_modules=("json",),
            ),
            RolloutEngineSpec(
                name="roll",
                description="test rollout",
                engine="polyrl.interfaces.rollout_engine:RolloutEngine",
            ),
            RolloutEngineSpec(
                name="ghost",
                description="a rollout whose backend is not installed",
                engine="polyrl.interfaces.rollout_engine:RolloutEngine",
                runtime_modules=(NO_SUCH_MODULE,),
            ),
            RolloutEngineSpec(
                name="broken",
                description="a rollout whose implementation module imports a missing module",
                engine=f"{NO_SUCH_MODULE}.engine:Engine",
            ),
            AdvantageEstimatorSpec(
                name="est",
                description="test estimator",
                fn="polyrl.interfaces.algorithms:AdvantageEstimatorFn",
            ),
            LoggerSpec(
                name="ghostlog",
                description="a logger whose library is not installed",
                logger="polyrl.loggers.jsonl:JsonlLogger",
                runtime_modules=(NO_SUCH_MODULE,),
            ),
        ],
        distribution="polyrl-preflight-test",
        version="1.0",
    )


def test_everything_installed_passes(plugins) -> None:
    preflight(_cfg(), plugins)
    preflight(_cfg())  # the process registry by default


def test_missing_runtime_module_is_one_line_with_key_module_and_pip(plugins) -> None:
    with pytest.raises(PolyrlError) as info:
        preflight(_cfg(actor_rollout_ref__rollout__name="ghost"), plugins)
    lines = str(info.value).splitlines()
    assert len(lines) == 1, lines
    assert "actor_rollout_ref.rollout.name=ghost" in lines[0]
    assert repr(NO_SUCH_MODULE) in lines[0]
    assert lines[0].endswith("pip install 'polyrl-preflight-test'")


def test_implementation_that_fails_to_import_names_the_module(plugins) -> None:
    with pytest.raises(PolyrlError) as info:
        preflight(_cfg(actor_rollout_ref__rollout__name="broken"), plugins)
    (line,) = str(info.value).splitlines()
    assert line.startswith("actor_rollout_ref.rollout.name=broken needs the module ")
    assert NO_SUCH_MODULE in line and "pip install 'polyrl-preflight-test'" in line


def test_one_line_per_failing_plugin(plugins) -> None:
    cfg = _cfg(actor_rollout_ref__rollout__name="ghost")
    OmegaConf.update(cfg, "trainer.logger", ["console", "ghostlog"])
    with pytest.raises(PolyrlError) as info:
        preflight(cfg, plugins)
    lines = str(info.value).splitlines()
    assert [line.split(" ")[0] for line in lines] == [
        "actor_rollout_ref.rollout.name=ghost",
        "trainer.logger=ghostlog",
    ]


def test_unknown_first_party_name_gives_its_package(isolated_registry) -> None:
    cfg = _cfg(actor_rollout_ref__rollout__name="vllm")
    with pytest.raises(PolyrlError) as info:
        preflight(cfg, isolated_registry)
    vllm_lines = [line for line in str(info.value).splitlines() if "rollout.name=vllm" in line]
    assert len(vllm_lines) == 1
    assert "pip install 'polyrl-rollout-vllm[cpu]'" in vllm_lines[0]


def test_install_command_uses_the_device_extra() -> None:
    vllm = "polyrl-rollout-vllm"
    assert install_command(vllm, "cpu") == "pip install 'polyrl-rollout-vllm[cpu]'"
    assert install_command(vllm, "cuda") == "pip install 'polyrl-rollout-vllm[cuda]'"
    assert install_command("polyrl-rollout-hf", "cpu") == "pip install 'polyrl-rollout-hf'"
    assert install_command("polyrl-preflight-none", None) == "pip install 'polyrl-preflight-none'"


def test_module_available_does_not_import(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    assert module_available("json.tool") and "json.tool" not in sys.modules
    assert not module_available(NO_SUCH_MODULE)
    monkeypatch.setitem(sys.modules, "json", None)  # hidden, as the subprocess tests do
    assert not module_available("json")


# ---- for real: `polyrl train` with vLLM hidden --------------------------------------------------
HIDE_ENV = "POLYRL_TEST_HIDE_MODULES"
SITECUSTOMIZE = f"""
import os, sys
# Hide modules as if they were not installed: import raises ModuleNotFoundError and
# importlib.util.find_spec returns None.
for _name in filter(None, os.environ.get({HIDE_ENV!r}, "").split(",")):
    sys.modules[_name] = None
"""


def hidden_env(tmp_path: Path, *modules: str) -> dict[str, str]:
    site = tmp_path / "hide_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYRL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env[HIDE_ENV] = ",".join(modules)
    env["POLYRL_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def test_train_with_vllm_missing_fails_fast_with_one_line(tmp_path) -> None:
    pytest.importorskip("polyrl_rollout_vllm")
    env = hidden_env(tmp_path, "vllm")
    hidden = subprocess.run(
        [sys.executable, "-c", "import vllm"], capture_output=True, text=True, env=env
    )
    assert "ModuleNotFoundError" in hidden.stderr  # the hiding works
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "polyrl",
            "train",
            "recipe=tiny",
            "actor_rollout_ref.rollout.name=vllm",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "actor_rollout_ref.rollout.name=vllm" in errors[0]
    assert "'vllm'" in errors[0] and "pip install 'polyrl-rollout-vllm[cpu]'" in errors[0]
    assert "Traceback" not in done.stderr
    # before Ray starts: what remains is the interpreter's imports, which a loaded machine slows
    assert "Started a local Ray instance" not in done.stderr + done.stdout
    assert elapsed < 30, f"took {elapsed:.1f}s"
