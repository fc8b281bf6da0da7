"""The package boundaries the toolkit exists for: no engine package imports another, the toolkit
imports no engine, and importing the toolkit's package is light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[2]
ENGINE_PACKAGES = {
    "engine_fsdp": "polyrl_engine_fsdp",
    "engine_deepspeed": "polyrl_engine_deepspeed",
    "engine_megatron": "polyrl_engine_megatron",
}


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("folder", sorted(ENGINE_PACKAGES))
def test_no_engine_imports_another_engine(folder: str) -> None:
    others = {pkg for name, pkg in ENGINE_PACKAGES.items() if name != folder}
    offending = [
        f"{path.relative_to(PLUGINS)}: {module}"
        for path in sorted((PLUGINS / folder).glob("**/*.py"))
        for module in _imported_modules(path)
        if module.split(".")[0] in others
    ]
    assert offending == []


def test_the_toolkit_imports_no_engine() -> None:
    offending = [
        f"{path.name}: {module}"
        for path in sorted((PLUGINS / "engine_kit/src").glob("**/*.py"))
        for module in _imported_modules(path)
        if module.split(".")[0] in ENGINE_PACKAGES.values()
    ]
    assert offending == []


def test_the_toolkit_package_and_its_checks_are_light() -> None:
    code = "import sys, polyrl_engine_kit, polyrl_engine_kit.checks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
