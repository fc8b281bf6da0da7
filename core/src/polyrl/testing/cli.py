"""Running the ``polyrl`` command line for tests: in a fresh interpreter (``run_polyrl``), or in
the test's own process (``run_polyrl_here``). Light: stdlib only until a run starts."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping

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


def run_polyrl_here(
    *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``polyrl *args`` run by :func:`polyrl.cli.main` inside this process, returned as
    :func:`run_polyrl` returns it (exit status, the text written to ``sys.stdout`` and
    ``sys.stderr``).

    A test process has imported torch and the engines already; a fresh interpreter imports them
    again, which is most of a short ``polyrl train`` with :data:`IN_PROCESS_OVERRIDES`. What a
    run may change for the process is put back afterwards: the environment (``env`` is laid over
    it for the run), torch's thread count and the signal handlers (``main`` restores those).
    Not for runs that are signalled, killed or start Ray workers from this process's
    environment: use :func:`run_polyrl` for those.

    The in-process worker makes torch's default process group, which a process holds once: a
    group an earlier test left behind is destroyed before the run, and one the run left (it
    failed before its shutdown) after it."""
    import torch

    from polyrl.cli import main

    saved_env, threads = dict(os.environ), torch.get_num_threads()
    os.environ.update(env or {})
    out, err = io.StringIO(), io.StringIO()
    _leave_default_group()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        _leave_default_group()
    return subprocess.CompletedProcess(
        ["polyrl", *args], code, stdout=out.getvalue(), stderr=err.getvalue()
    )


def _leave_default_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
