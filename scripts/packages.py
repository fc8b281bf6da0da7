"""Build polyrl's distributions, check their metadata, and install them into a fresh venv.

Usage::

    .venv/bin/python scripts/packages.py build --out dist/            # core + every plugin
    .venv/bin/python scripts/packages.py build --out dist/ core plugins/rollout_hf
    .venv/bin/python scripts/packages.py smoke --dist dist/ polyrl polyrl-rollout-hf ...

``build`` makes an sdist and, from that sdist, a wheel for each package folder (so a file the
sdist forgets breaks the wheel too), fails on any deprecation warning the build backend prints,
runs ``twine check --strict`` and checks what PyPI and users rely on: an SPDX license, the
readme, classifiers, project URLs and a bounded ``polyrl`` requirement in every plugin.
``plugins/_template`` is left out: it is a skeleton to copy, not a package to publish.

``smoke`` creates a fresh venv, installs the named distributions from the wheels in ``--dist``
only (never from the source tree) and runs ``polyrl plugins`` and ``polyrl validate
recipe=tiny`` in it (with ``--train``, two steps of ``polyrl train recipe=tiny`` too).
Third-party requirements come from the index pinned to this venv's versions, or, with
``--deps-from VENV``, are borrowed from that venv's site-packages (every polyrl distribution
hidden), which keeps the check fast enough for the test suite while pip still verifies,
offline, that every requirement of the wheels is met.

The build runs without isolation: the running venv must have ``setuptools>=77`` (SPDX license
strings) and ``build``; ``twine`` is needed for the check.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import venv
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNPUBLISHED = {"_template"}
LICENSE = "Apache-2.0"
# A polyrl requirement with a lower and an upper bound, e.g. "polyrl>=0.1,<0.2".
BOUNDED_POLYRL = re.compile(r"^polyrl\s*(?=.*>=)(?=.*<)[<>=!~.,\d\s]+$")
REQUIRED_URLS = ("Homepage", "Documentation", "Source")
DEPRECATION = re.compile(r"deprecat", re.IGNORECASE).search
BUILD_LEFTOVERS = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__")


def publishable_packages() -> list[Path]:
    """Core first, then every plugin folder except the template."""
    plugins = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))
    return [ROOT / "core", *(p for p in plugins if p.name not in UNPUBLISHED)]


def build(folders: Sequence[Path], out: Path) -> list[str]:
    """Build each folder into ``out``; return the problems found (empty when all is well)."""
    out.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    for folder in folders:
        # From a clean copy: a build in the tree leaves build/ and egg-info behind, and a
        # stale build/lib can carry deleted modules into the wheel.
        with tempfile.TemporaryDirectory(prefix="polyrl-build-") as tmp:
            source = Path(tmp) / folder.name
            shutil.copytree(folder, source, ignore=BUILD_LEFTOVERS)
            command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out)]
            done = subprocess.run([*command, str(source)], capture_output=True, text=True)
        log = done.stdout + done.stderr
        if done.returncode != 0:
            problems.append(f"{folder.name}: build failed:\n{log[-3000:]}")
            continue
        warnings = dict.fromkeys(line.strip() for line in log.splitlines() if DEPRECATION(line))
        problems += [f"{folder.name}: {line}" for line in warnings]
    files = sorted(str(p) for p in out.iterdir() if p.suffix in (".whl", ".gz"))
    twine = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
    )
    if twine.returncode != 0:
        problems.append(f"twine check --strict failed:\n{twine.stdout}{twine.stderr}")
    for wheel in sorted(out.glob("*.whl")):
        problems += [f"{wheel.name}: {p}" for p in metadata_problems(wheel)]
    return problems


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def metadata_problems(wheel: Path) -> list[str]:
    """What a published polyrl wheel must declare beyond what twine checks."""
    meta = wheel_metadata(wheel)
    problems = []
    if meta.get("License-Expression") != LICENSE:
        problems.append(f"License-Expression is {meta.get('License-Expression')!r}, not {LICENSE}")
    if meta.get("Description-Content-Type") != "text/markdown" or not meta.get_payload():
        problems.append("no markdown readme (project.readme)")
    if not meta.get_all("Classifier"):
        problems.append("no classifiers (project.classifiers)")
    urls = {u.split(",")[0].strip() for u in meta.get_all("Project-URL") or []}
    problems += [f"no {label} URL (project.urls)" for label in REQUIRED_URLS if label not in urls]
    if meta["Name"] != "polyrl":
        requirements = [r.split(";")[0].strip() for r in meta.get_all("Requires-Dist") or []]
        polyrl = [r for r in requirements if re.split(r"[<>=!~\s\[]", r)[0] == "polyrl"]
        if not polyrl or not all(BOUNDED_POLYRL.match(r) for r in polyrl):
            problems.append(f"polyrl requirement {polyrl} lacks a lower and an upper bound")
    return problems


def distribution_of(wheel: Path) -> str:
    """``polyrl_rollout_hf-0.1.0-py3-none-any.whl`` -> ``polyrl-rollout-hf``."""
    return wheel.name.split("-")[0].replace("_", "-")


def venv_site_packages(venv_dir: Path) -> Path:
    paths = sysconfig.get_paths(vars={"base": str(venv_dir), "platbase": str(venv_dir)})
    return Path(paths["purelib"])


def borrow_dependencies(source_venv: Path, target_venv: Path) -> None:
    """Make ``source_venv``'s third-party packages importable in ``target_venv``.

    A folder of links to every entry of the source site-packages except polyrl's own
    distributions (and editable-install hooks) is added to the target's path by a ``.pth``.
    """
    source = venv_site_packages(source_venv)
    borrowed = target_venv / "borrowed-site-packages"
    borrowed.mkdir()
    for entry in source.iterdir():
        name = entry.name.lower()
        if name.startswith(("polyrl", "__editable__", "_polyrl")) or name.endswith(".pth"):
            continue
        (borrowed / entry.name).symlink_to(entry)
    (venv_site_packages(target_venv) / "borrowed.pth").write_text(f"{borrowed}\n")


def frozen_constraints(path: Path) -> Path:
    """This venv's third-party versions, so the fresh venv resolves what was tested here."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    path.write_text("\n".join(r for r in frozen if not r.lower().startswith("polyrl")) + "\n")
    return path


def smoke(
    dist: Path, distributions: Sequence[str], deps_from: Path | None, train: bool = False
) -> list[str]:
    """Install ``distributions`` from ``dist``'s wheels into a fresh venv and run the CLI
    (with ``train``, two steps of ``recipe=tiny`` too)."""
    wheels = {distribution_of(w): w for w in dist.glob("*.whl")}
    missing = [d for d in distributions if d not in wheels]
    if missing:
        return [f"no wheel in {dist} for {', '.join(missing)}: run `build` for them first"]
    with tempfile.TemporaryDirectory(prefix="polyrl-smoke-") as tmp:
        fresh = Path(tmp) / "venv"
        # Borrowing brings pip and setuptools too: the venv's own older copies would shadow them.
        venv.create(fresh, with_pip=deps_from is None)
        python = str(fresh / "bin" / "python")
        install = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        if deps_from is not None:
            borrow_dependencies(deps_from, fresh)
            install.append("--no-index")
        else:
            install += ["-c", str(frozen_constraints(Path(tmp) / "constraints.txt"))]
        # Run from the temporary folder: nothing of the source tree is on the path.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        commands = [
            [*install, *(str(wheels[d]) for d in distributions)],
            [str(fresh / "bin" / "polyrl"), "plugins"],
            [str(fresh / "bin" / "polyrl"), "validate", "recipe=tiny"],
        ]
        if train:
            run = f"trainer.default_local_dir={tmp}/run"
            tiny = ["recipe=tiny", "trainer.total_training_steps=2", run]
            commands.append([str(fresh / "bin" / "polyrl"), "train", *tiny])
        outputs = []
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True, cwd=tmp, env=env)
            outputs.append(done.stdout + done.stderr)
            if done.returncode != 0:
                return [f"`{' '.join(command[:4])} ...` failed:\n{outputs[-1][-3000:]}"]
        listed = outputs[1]
        return [f"polyrl plugins does not list {d}" for d in distributions if d not in listed]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="sdist + wheel per package, metadata checked")
    build_cmd.add_argument("--out", type=Path, required=True)
    build_cmd.add_argument("folders", nargs="*", type=Path, help="default: core + every plugin")
    smoke_cmd = commands.add_parser("smoke", help="install wheels into a fresh venv, run the CLI")
    smoke_cmd.add_argument("--dist", type=Path, required=True)
    smoke_cmd.add_argument("--deps-from", type=Path, help="borrow third-party packages")
    smoke_cmd.add_argument("--train", action="store_true", help="also 2 steps of recipe=tiny")
    smoke_cmd.add_argument("distributions", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "build":
        folders = [f.resolve() for f in args.folders] or publishable_packages()
        problems = build(folders, args.out.resolve())
    else:
        deps_from = args.deps_from.resolve() if args.deps_from else None
        problems = smoke(args.dist.resolve(), args.distributions, deps_from, args.train)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"polyrl packages: {args.command} ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
