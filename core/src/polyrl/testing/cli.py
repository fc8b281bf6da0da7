"""Running the ``polyrl`` command line in a fresh interpreter, for tests (light: stdlib only)."""

from __future__ import annotations

import subprocess
import sys

#: ``polyrl train`` overrides that run the whole run in its own process, without Ray: one
#: worker (``trainer.worker_backend=in_process``). For an end-to-end test whose point is the
#: algorithm, the data, the checkpoints or the outputs rather than Ray or data parallelism:
#: it skips starting a cluster and worker processes, most of a short run's time.
IN_PROCESS_OVERRIDES = ("trainer.worker_backend=in_process", "trainer.n_gpus_per_node=1")


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
