"""``polyrl doctor``: the report a bug report starts with."""

from __future__ import annotations

import json
import subprocess
import sys

from polyrl.doctor import disk, versions


def test_versions_come_from_package_metadata() -> None:
    found = {f.name: f.value for f in versions()}
    assert found["polyrl"] == "0.1.0"
    assert found["torch"].startswith("2.")
    assert "ray" in found and "transformers" in found


def test_free_disk_is_measured_at_the_nearest_existing_parent(tmp_path) -> None:
    (finding,) = disk(str(tmp_path / "not" / "yet" / "created"))
    assert f"at {tmp_path} " in finding.value
    assert finding.value.split()[0].replace(".", "").isdigit()


def test_doctor_reports_every_check_and_exits_zero_when_healthy(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "polyrl", "doctor", "--json", "recipe=tiny",
         f"trainer.default_local_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    findings = {f["name"]: f for f in json.loads(done.stdout)}
    for name in ("python", "polyrl", "torch", "ray", "cuda devices", "ray start", "free disk"):
        assert findings[name]["ok"], findings[name]
    assert findings["ray start"]["value"] == "ok"
    assert any(name.startswith("plugin algorithm grpo") for name in findings)
