"""The chaos benchmark (``benchmarks/chaos.py``, 100 steps by default) in short: ``recipe=tiny``
for 6 steps with a Ray worker killed -9 in one step (the controller restarts the workers) and the
whole driver killed -9 in another (the benchmark's outer loop runs the same command again),
against an undisturbed run of the same command: the final weights are bitwise equal and the
metrics hold every step exactly once (the benchmark checks both and exits 1 otherwise).

One form only: a lost worker alone is tests/test_faults_recovery.py's case (every step and every
prompt trained once), so this one adds what only the benchmark does, both kinds of kill in one run
and the equality with the undisturbed run. The undisturbed run runs beside the chaos run
(``--concurrent``): on a 2-core machine the two in a row take over a minute, mostly start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHAOS = Path(__file__).resolve().parents[1] / "benchmarks" / "chaos.py"


@pytest.mark.slow
def test_a_run_losing_a_worker_and_its_driver_ends_with_the_undisturbed_runs_weights(
    tmp_path: Path,
) -> None:
    report_file = tmp_path / "report.json"
    args = ["--steps", "6", "--worker-kills", "1", "--driver-kills", "1", "--concurrent"]
    cmd = [sys.executable, str(CHAOS), "--dir", str(tmp_path), "--json", str(report_file), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{logs}"
    report = json.loads(report_file.read_text())
    assert report["worker_kills"] == 1 and report["restarts"] == 1, report
    assert report["driver_kills"] == 1, report
    assert report["weights_equal"] and report["every_step_once"], report
