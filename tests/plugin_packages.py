"""Helpers of the tests that install plugin packages with pip (a docs page's example, as a user
who copied the page would, or tests/fixtures' packages) and run ``polyrl`` with them: in a fresh
interpreter (``polyrl``) or in the test's own process (``polyrl_here``)."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from polyrl.api.testing import run_polyrl_here

ROOT = Path(__file__).resolve().parents[1]


def doc_blocks(page: Path, distribution: str) -> dict[str, str]:
    """The page's code blocks that follow a line naming their file
    (`` `<distribution>/<path>`: ``), by path."""
    pattern = re.compile(rf"`{re.escape(distribution)}/([^`]+)`:\n\n```[a-z]*\n(.*?)```", re.S)
    return dict(pattern.findall(page.read_text()))


def install_to_target(package: Path, root: Path) -> Path:
    """``pip install --target`` of ``package`` (built from a copy: pip builds in-tree), never
    into the environment; the folder to put on ``PYTHONPATH``."""
    source = root / "src"
    shutil.copytree(package, source)
    target = root / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return target


def polyrl(site: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """``python -m polyrl <args>`` with the installed package on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYRL_")}
    env.update(PYTHONPATH=str(site), PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "polyrl", *args],
        capture_output=True, text=True, env=env, timeout=timeout, check=False,
    )  # fmt: skip


def polyrl_here(
    site: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``polyrl <args>`` run in this process (:func:`run_polyrl_here`: no interpreter start, no
    re-imports) seeing the installed packages as :func:`polyrl` does on ``PYTHONPATH``: ``site``
    first on ``sys.path``, where entry points are read from, the process registry discovered
    anew, no ``POLYRL_*`` variable but ``env``'s. Not for the packages whose import blocks
    (its thread would stay behind) and not for runs that start Ray.

    Afterwards nothing of the packages is left for the next test of this process: ``sys.path``,
    the environment and the registry are put back, and the modules imported from ``site`` are
    forgotten."""
    from polyrl import registry

    ours = {Path(e.name).stem for e in site.iterdir() if not e.name.endswith(".dist-info")}
    saved_path, saved_env, saved_registry = list(sys.path), dict(os.environ), registry._registry
    for name in [k for k in os.environ if k.startswith("POLYRL_")]:
        del os.environ[name]
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    registry.set_registry(None)
    try:
        return run_polyrl_here(*args, env=env)
    finally:
        registry.set_registry(saved_registry)
        sys.path[:] = saved_path
        sys.path_importer_cache.pop(str(site), None)
        os.environ.clear()
        os.environ.update(saved_env)
        for module in [m for m in sys.modules if m.partition(".")[0] in ours]:
            del sys.modules[module]
