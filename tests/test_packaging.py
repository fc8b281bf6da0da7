"""polyrl's distributions build, pass the metadata checks and work installed from wheels alone.

``scripts/packages.py`` does the work; these tests run it as CI does. The whole set of packages
is built by ``.ci/run``; here core and the plugins ``recipe=tiny`` selects are enough.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "packages.py"
# recipe=tiny's plugins: the FSDP engine (and the toolkit it depends on), the HF rollout, GRPO.
TINY = {
    "core": "polyrl",
    "plugins/engine_kit": "polyrl-engine-kit",
    "plugins/engine_fsdp": "polyrl-engine-fsdp",
    "plugins/rollout_hf": "polyrl-rollout-hf",
    "plugins/algo_grpo": "polyrl-algo-grpo",
}


def packages(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


def write_package(root: Path, license_line: str, dependencies: str) -> Path:
    (root / "src" / "polyrl_fixture_meta").mkdir(parents=True)
    (root / "src" / "polyrl_fixture_meta" / "__init__.py").write_text("")
    (root / "README.md").write_text("# polyrl-fixture-meta\n\nA fixture.\n")
    (root / "pyproject.toml").write_text(
        f"""[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "polyrl-fixture-meta"
version = "0.1.0"
description = "fixture"
readme = "README.md"
{license_line}
dependencies = {dependencies}

[tool.setuptools.packages.find]
where = ["src"]
"""
    )
    return root


def test_a_license_table_an_unbounded_polyrl_and_missing_urls_are_reported(tmp_path: Path):
    folder = write_package(tmp_path / "pkg", 'license = { text = "Apache-2.0" }', '["polyrl"]')
    done = packages("build", "--out", str(tmp_path / "dist"), str(folder))
    assert done.returncode == 1
    report = done.stderr
    assert "pkg: WARNING `project.license` as a TOML table is deprecated" in report
    assert "License-Expression is None, not Apache-2.0" in report
    assert "no classifiers" in report
    assert "no Documentation URL" in report
    assert "polyrl requirement ['polyrl'] lacks a lower and an upper bound" in report


def test_a_smoke_install_names_a_wheel_that_was_not_built(tmp_path: Path):
    (tmp_path / "dist").mkdir()
    done = packages("smoke", "--dist", str(tmp_path / "dist"), "polyrl-rollout-hf")
    assert done.returncode == 1
    assert "no wheel in" in done.stderr and "polyrl-rollout-hf" in done.stderr


@pytest.mark.slow
def test_core_and_the_tiny_plugins_install_from_their_wheels_alone(tmp_path: Path):
    dist = tmp_path / "dist"
    built = packages("build", "--out", str(dist), *(str(ROOT / f) for f in TINY))
    assert built.returncode == 0, built.stderr
    assert len(list(dist.glob("*.whl"))) == len(list(dist.glob("*.tar.gz"))) == len(TINY)
    # Third-party packages are borrowed from this venv; every polyrl one comes from dist/.
    smoke = packages("smoke", "--dist", str(dist), "--deps-from", sys.prefix, *TINY.values())
    assert smoke.returncode == 0, smoke.stderr


def test_every_publishable_package_declares_what_the_build_check_requires():
    """The same rules the built wheels are checked against, read from each pyproject.toml.

    The full build runs only in ``.ci/run``, after the suite; this catches a new plugin's
    missing URL or license in the suite itself.
    """
    sys.path.insert(0, str(SCRIPT.parent))
    import packages as script

    problems = []
    for folder in script.publishable_packages():
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        urls = project.get("urls", {})
        problems += [
            f"{folder.name}: no {label} URL" for label in script.REQUIRED_URLS if label not in urls
        ]
        if project.get("license") != script.LICENSE:
            problems.append(f"{folder.name}: license is {project.get('license')!r}")
        if not project.get("classifiers"):
            problems.append(f"{folder.name}: no classifiers")
    assert problems == []
