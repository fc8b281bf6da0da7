"""Running the ``polyrl`` command line in a fresh interpreter, for tests (light: stdlib only)."""

from __future__ import annotations

import subprocess
import sys


def run_polyrl(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """``python -m polyrl *args`` with ``env`` as its whole environment; output captured as text,
    a failing exit status returned, not raised."""
    return subprocess.run(
        [sys.executable, "-m", "polyrl", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
