"""Helpers of the tests that install a docs page's example plugin package with pip and run
``polyrl`` with it, as a user who copied the page would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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
