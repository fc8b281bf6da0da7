"""Plugins installed with pip are discovered through their entry points.

The packages under tests/fixtures are pip-installed into a throwaway ``--target`` folder; the
environment itself is untouched. ``polyrl`` sees that folder as a user's ``PYTHONPATH`` shows it:
a fresh ``python -m polyrl`` has it on ``PYTHONPATH`` (the table listing, a ``train``, and every
run beside the packages whose import exits, interrupts or blocks), the other commands run in this
process with the folder first on ``sys.path`` (:func:`plugin_packages.polyrl_here`: entry points
are read from ``sys.path`` either way), which skips an interpreter start and polyrl's imports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from plugin_packages import polyrl_here

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures"
PACKAGES = ("polyrl_fixture_good", "polyrl_fixture_broken", "polyrl_fixture_clash")


def install(root: Path, packages: tuple[str, ...]) -> Path:
    """Install the fixture distributions ``packages`` with pip (wheels built) into a folder of
    ``root``; returns that folder."""
    sources = []
    for package in packages:  # build from copies: pip builds in-tree and leaves build/ behind
        shutil.copytree(FIXTURES / package, root / "src" / package)
        sources.append(str(root / "src" / package))
    target = root / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), *sources],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return target


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the three fixture distributions."""
    return install(tmp_path_factory.mktemp("fixture_plugins"), PACKAGES)


def polyrl(
    site: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("POLYRL_")}
    environ.update({"PYTHONPATH": str(site), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "polyrl", *args],
        capture_output=True, text=True, env=environ, timeout=120, check=False,
    )  # fmt: skip


def rows(site: Path, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    done = polyrl_here(site, "plugins", "--json", *args, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def data_and_model(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("data")
    table = pa.table(
        {
            "data_source": ["t"],
            "prompt": [[{"role": "user", "content": "1+1?"}]],
            "reward_model": [{"ground_truth": "2", "style": "rule"}],
        }
    )
    pq.write_table(table, root / "train.parquet")
    (root / "model").mkdir()
    return [
        "~recipe",  # the schema's defaults, with explicit batch sizes: independent of any recipe
        f"data.train_files={root / 'train.parquet'}",
        f"actor_rollout_ref.model.path={root / 'model'}",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    ]


def test_installed_plugin_is_listed_with_package_and_version(site: Path) -> None:
    listed = rows(site, "--kind", "advantage_estimator")
    mine = [r for r in listed if r["name"] == "fixture_sign"]
    assert len(mine) == 1
    row = mine[0]
    assert (row["package"], row["version"], row["status"]) == ("polyrl-fixture-good", "0.3.1", "ok")
    assert row["kind"] == "advantage_estimator" and row["plugin"] == "fixture"
    assert row["capabilities"] == {
        "groups": False,
        "requires": ["token_level_rewards", "response_mask", "uid"],
    }
    assert "sign of the outcome" in row["description"]
    # --kind filters registrations; broken modules are always shown (they may provide any kind)
    assert {r["kind"] for r in listed} <= {"advantage_estimator", None}


@pytest.fixture(scope="module")
def table(site: Path) -> subprocess.CompletedProcess:
    """``polyrl plugins`` in a fresh interpreter, the packages on its ``PYTHONPATH``."""
    return polyrl(site, "plugins")


def test_table_output_names_the_package(table: subprocess.CompletedProcess) -> None:
    assert table.returncode == 0, table.stderr
    line = next(x for x in table.stdout.splitlines() if x.startswith("fixture_sign "))
    assert "polyrl-fixture-good" in line and "0.3.1" in line and " ok " in line


def test_validate_accepts_the_plugin_by_name(site: Path, data_and_model: list[str]) -> None:
    args = ["algorithm.adv_estimator=fixture_sign", "actor_rollout_ref.rollout.n=1",
            "plugins.fixture_sign.scale=2.0", *data_and_model]  # fmt: skip
    done = polyrl_here(site, "validate", *args)
    assert "algorithm.adv_estimator" not in done.stderr, done.stderr
    assert "plugins.fixture_sign" not in done.stderr, done.stderr
    # exit 0 needs CPU engines too: take whichever the environment has installed
    listed = rows(site)
    engines = {}
    for kind in ("training_engine", "rollout_engine"):
        cpu = [
            r["name"]
            for r in listed
            if r["kind"] == kind and r["status"] == "ok" and r["capabilities"].get("cpu")
        ]
        if not cpu:
            pytest.skip(f"no CPU {kind} installed: cannot check a fully valid config")
        engines[kind] = cpu[0]
    done = polyrl_here(site, "validate", *args,
                  f"actor_rollout_ref.actor.strategy={engines['training_engine']}",
                  f"actor_rollout_ref.rollout.name={engines['rollout_engine']}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "config OK" in done.stdout


def test_plugin_section_keys_are_checked_against_its_config_class(
    site: Path, data_and_model: list[str]
) -> None:
    done = polyrl_here(site, "validate", "algorithm.adv_estimator=fixture_sign",
                       "plugins.fixture_sign.scal=2.0", *data_and_model)  # fmt: skip
    assert done.returncode == 1
    assert "unknown key plugins.fixture_sign.scal" in done.stderr
    assert "Did you mean plugins.fixture_sign.scale?" in done.stderr


def test_a_step_whose_chain_misses_a_key_is_rejected_before_anything_starts(
    site: Path, data_and_model: list[str]
) -> None:
    """``fixture_needs_values`` reads ``values``, which no stage of the standard step provides:
    validate and train both refuse, naming the stage and the key, without starting Ray (the
    train in a fresh interpreter, whose whole output would show Ray starting)."""
    args = ["algorithm.adv_estimator=fixture_needs_values", *data_and_model]
    for done in (polyrl_here(site, "validate", *args), polyrl(site, "train", *args)):
        assert done.returncode == 1, done.stderr
        line = next(x for x in done.stderr.splitlines() if "'values'" in x)
        assert "stage 'adv' requires batch key 'values'" in line
        assert "Ray" not in done.stderr and "ray" not in done.stdout


def test_broken_plugin_is_listed_with_its_error(
    site: Path, table: subprocess.CompletedProcess
) -> None:
    broken = [r for r in rows(site) if r["package"] == "polyrl-fixture-broken"]
    assert len(broken) == 1
    assert broken[0]["status"] == "broken" and broken[0]["version"] == "0.0.1"
    assert "No module named 'polyrl_fixture_missing_backend'" in broken[0]["error"]
    assert "fixture_broken from polyrl-fixture-broken 0.0.1: ModuleNotFoundError" in table.stdout


def test_doctor_flags_the_broken_plugin(site: Path) -> None:
    done = polyrl_here(site, "doctor")
    assert done.returncode == 1, done.stdout + done.stderr
    bad = [line for line in done.stdout.splitlines() if line.startswith("BAD")]
    assert any("polyrl-fixture-broken" in line for line in bad), done.stdout


def test_selecting_a_name_of_the_broken_plugin_shows_its_error(
    site: Path, data_and_model: list[str]
) -> None:
    done = polyrl_here(site, "validate", "algorithm.adv_estimator=fixture_broken_estimator",
                       *data_and_model)  # fmt: skip
    assert done.returncode == 1
    line = next(x for x in done.stderr.splitlines() if "algorithm.adv_estimator" in x)
    assert "unknown advantage_estimator 'fixture_broken_estimator'" in line
    assert "polyrl-fixture-broken" in line and "polyrl_fixture_missing_backend" in line


def test_other_commands_work_beside_a_broken_plugin(site: Path) -> None:
    done = polyrl_here(site, "config", "algorithm.adv_estimator=fixture_sign")
    assert done.returncode == 0, done.stderr
    assert "adv_estimator: fixture_sign" in done.stdout


def test_two_packages_registering_one_name_are_both_named(
    site: Path, data_and_model: list[str]
) -> None:
    dup = [r for r in rows(site, "--kind", "logger") if r["name"] == "fixture_dup"]
    assert {r["package"] for r in dup} == {"polyrl-fixture-good", "polyrl-fixture-clash"}
    assert all(r["status"] == "conflict" for r in dup)
    # the same entry-point name in two distributions must not hide either of them
    assert all(r["plugin"] == "fixture" for r in dup)
    done = polyrl_here(site, "validate", "trainer.logger=[console,fixture_dup]", *data_and_model)
    assert done.returncode == 1
    line = next(x for x in done.stderr.splitlines() if "fixture_dup" in x)
    assert "polyrl-fixture-good 0.3.1" in line and "polyrl-fixture-clash 0.2.0" in line


def test_polyrl_plugins_env_limits_loading_by_package(site: Path) -> None:
    listed = rows(site, env={"POLYRL_PLUGINS": "polyrl-fixture-clash"})
    packages = {r["package"] for r in listed}
    assert packages == {"polyrl", "polyrl-fixture-clash"}
    assert next(r for r in listed if r["name"] == "fixture_dup")["status"] == "ok"


def test_disable_autoload_env_leaves_only_builtins(site: Path) -> None:
    listed = rows(site, env={"POLYRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert {r["package"] for r in listed} == {"polyrl"}


# ---- plugins whose module exits, interrupts or blocks at import --------------------------------
HOSTILE = {  # fixture package -> what `polyrl plugins` says about it
    "polyrl_fixture_exits": "SystemExit: 3 (the module calls sys.exit while it is imported)",
    "polyrl_fixture_interrupts": "KeyboardInterrupt (raised by the module itself",
    "polyrl_fixture_hangs": "did not finish importing within 2 s and was abandoned",
}
#: The bound these runs wait out (its default, 20 s, is core/tests/test_registry.py's to check).
FAST_ABANDON = {"POLYRL_PLUGIN_DISCOVERY_TIMEOUT_S": "2"}


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install(tmp_path_factory.mktemp("hostile_plugins"), tuple(HOSTILE))


def test_plugins_lists_a_module_that_exits_interrupts_or_blocks_as_broken_and_exits_0(
    hostile_site: Path,
) -> None:
    """The blocking import is abandoned at the bound, the listing goes on."""
    start = time.monotonic()
    done = polyrl(hostile_site, "plugins", env=FAST_ABANDON)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert elapsed < 20
    for package, reason in HOSTILE.items():
        line = next(x for x in done.stdout.splitlines() if package.replace("_", "-") in x)
        assert reason in line, line
    assert "import blocked" in done.stdout and "pip uninstall polyrl-fixture-hangs" in done.stdout
    assert "console" in done.stdout  # the healthy registrations are still listed


def test_a_run_not_selecting_them_validates_without_a_word_about_them(hostile_site: Path) -> None:
    done = polyrl(hostile_site, "validate", "recipe=tiny", env=FAST_ABANDON)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "config OK" in done.stdout
    assert "fixture" not in done.stdout + done.stderr


def test_a_run_not_selecting_them_trains(hostile_site: Path, tmp_path: Path) -> None:
    start = time.monotonic()
    done = polyrl(hostile_site, "train", "recipe=tiny", f"trainer.default_local_dir={tmp_path}",
                  "trainer.total_training_steps=1", "trainer.val_before_train=false",
                  env=FAST_ABANDON)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert (tmp_path / "global_step_1").is_dir()
    assert "fixture" not in done.stderr
    # the workers inherit the abandoned import and skip it instead of waiting out the bound
    assert time.monotonic() - start < 60


def test_selecting_a_name_they_may_provide_is_one_line_naming_them(hostile_site: Path) -> None:
    done = polyrl(hostile_site, "validate", "recipe=tiny",
                  "trainer.logger=[console,fixture_hangs_logger]", env=FAST_ABANDON)  # fmt: skip
    assert done.returncode == 1
    [line] = [x for x in done.stderr.splitlines() if "fixture_hangs_logger" in x]
    assert "may provide it" in line
    assert all(package.replace("_", "-") in line for package in HOSTILE)
