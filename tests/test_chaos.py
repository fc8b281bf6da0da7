"""The chaos benchmark (``benchmarks/chaos.py``) in short: ``recipe=tiny`` with Ray workers
killed -9 at random moments (and, in the slow form, the whole driver too), against an
undisturbed run of the same command: the final weights are bitwise equal and the metrics hold
every step exactly once (the benchmark checks both and exits 1 otherwise).

Both are slow: two runs of the command plus a restart take over a minute on a shared 2-core
machine. The default suite's short form is tests/test_faults_recovery.py (a worker killed -9,
the controller's restart, every step and prompt trained once)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHAOS = Path(__file__).resolve().parents[1] / "benchmarks" / "chaos.py"


def chaos(tmp_path: Path, *args: str) -> dict:
    report = tmp_path / "report.json"
    cmd = [sys.executable, str(CHAOS), "--dir", str(tmp_path), "--json", str(report), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{logs}"
    return json.loads(report.read_text())


@pytest.mark.slow
def test_a_run_that_loses_a_worker_ends_with_the_undisturbed_runs_weights(tmp_path: Path) -> None:
    report = chaos(tmp_path, "--steps", "4", "--worker-kills", "1", "--driver-kills", "0")
    assert report["worker_kills"] == 1 and report["restarts"] == 1, report
    assert report["weights_equal"] and report["every_step_once"], report


@pytest.mark.slow
def test_a_run_losing_workers_and_its_driver_ends_with_the_undisturbed_runs_weights(
    tmp_path: Path,
) -> None:
    report = chaos(tmp_path, "--steps", "16", "--worker-kills", "2", "--driver-kills", "2")
    assert report["worker_kills"] == 2 and report["restarts"] == 2, report
    assert report["driver_kills"] == 2, report
    assert report["weights_equal"] and report["every_step_once"], report
