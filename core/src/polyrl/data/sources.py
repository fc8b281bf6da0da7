"""Turn ``data.train_files`` / ``data.val_files`` into parquet paths, generating built-in datasets
on first use.

A spec is a path, a list of paths, or ``builtin:<generator>[/<task>][?key=value&...]``, e.g.
``builtin:tiny_digits`` or ``builtin:reasoning_gym/chain_sum?train_size=512&max_terms=2``.
Built-ins are written once into ``$POLYRL_CACHE_DIR/data/<hash>/`` (default
``~/.cache/polyrl``), so that ``polyrl train`` works on a fresh machine with nothing prepared,
and every later run reuses the same files. The folder appears only when complete (written under
a temporary name, then renamed), so a crash mid-write never leaves half a dataset behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from polyrl.errors import DataError

BUILTIN_PREFIX = "builtin:"
#: Bump when a generator's output changes, so cached files of the old format are not reused.
GENERATOR_FORMAT_VERSION = 4
_SPLIT_ALIASES = {"train": "train", "val": "val", "validation": "val", "test": "val"}


def cache_dir() -> Path:
    """``$POLYRL_CACHE_DIR`` or ``~/.cache/polyrl``."""
    return Path(os.environ.get("POLYRL_CACHE_DIR") or Path.home() / ".cache" / "polyrl")


def parse_builtin(spec: str) -> tuple[str, str | None, dict[str, Any]]:
    """``builtin:name/task?k=v&k2=v2`` -> ``(name, task, {k: v, k2: v2})``.

    Values are JSON when they parse as JSON (``3``, ``true``, ``["+","-"]``), else strings.
    ``+`` is kept as is (not read as a space), so operator lists can be written plainly.
    """
    body = spec[len(BUILTIN_PREFIX) :]
    path, _, query = body.partition("?")
    name, _, task = path.partition("/")
    params: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, sep, raw = part.partition("=")
        if not sep or not key:
            raise DataError(f"{spec!r}: option {part!r} must look like key=value")
        value = unquote(raw)
        try:
            params[unquote(key)] = json.loads(value)
        except json.JSONDecodeError:
            params[unquote(key)] = value
    return name, task or None, params


def builtin_dir(spec: str) -> Path:
    """The cache folder of a built-in spec (whether or not it exists yet)."""
    name, task, params = parse_builtin(spec)
    key = json.dumps(
        {"name": name, "task": task, "params": params, "v": GENERATOR_FORMAT_VERSION},
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "data" / digest


def missing_extra_for(spec: str | Sequence[str] | None) -> str | None:
    """None unless a ``builtin:`` entry of ``spec`` (a data.train_files / data.val_files value)
    needs an optional library that is not installed; then one line naming the source, the
    library and the install command, e.g. ``builtin:reasoning_gym/chain_sum needs reasoning-gym:
    pip install 'polyrl[reasoning-gym]'``. Cheap: locates modules, imports none, generates
    nothing. The library is needed even when the data is cached: the rows' scorer uses it."""
    from polyrl.data.generate import GENERATOR_MODULES
    from polyrl.preflight import missing_extra

    entries = [spec] if isinstance(spec, str | Path) else list(spec or ())
    for entry in map(str, entries):
        if not entry.startswith(BUILTIN_PREFIX):
            continue
        try:
            name, task, _ = parse_builtin(entry)
        except DataError:
            continue  # a malformed spec is reported by the checks of its own
        modules = GENERATOR_MODULES.get(name, ())
        problem = missing_extra(f"{BUILTIN_PREFIX}{name}{f'/{task}' if task else ''}", modules)
        if problem:
            return problem
    return None


def materialize_builtin(spec: str) -> Path:
    """Generate the built-in dataset ``spec`` into its cache folder unless it is there; return
    the folder (holding ``train.parquet`` and ``val.parquet``)."""
    from polyrl.data.generate import GENERATORS

    name, task, params = parse_builtin(spec)
    if name not in GENERATORS:
        raise DataError(
            f"{spec!r}: unknown built-in dataset {name!r}; built-in: "
            f"{', '.join(f'{BUILTIN_PREFIX}{g}' for g in sorted(GENERATORS))}"
        )
    problem = missing_extra_for(spec)
    if problem:
        raise DataError(problem)
    final = builtin_dir(spec)
    if (final / "train.parquet").is_file() and (final / "val.parquet").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        GENERATORS[name](tmp, params, task)
        (tmp / "spec.json").write_text(json.dumps({"spec": spec}, indent=1) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished first (the folder exists and is complete): use theirs.
            if not (final / "train.parquet").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_data_files(spec: str | Sequence[str] | None, split: str) -> list[str]:
    """Parquet paths for ``spec``: paths pass through (a missing one is a DataError), each
    ``builtin:`` entry becomes its cached file of ``split`` (``train`` or ``val``)."""
    if spec is None:
        raise DataError(f"no {split} data given: set data.{split}_files to parquet path(s)")
    entries = [spec] if isinstance(spec, str | Path) else list(spec)
    if not entries:
        raise DataError(f"data.{split}_files is an empty list")
    wanted = _SPLIT_ALIASES.get(split)
    files: list[str] = []
    for entry in entries:
        entry = str(entry)
        if entry.startswith(BUILTIN_PREFIX):
            if wanted is None:
                raise DataError(f"split {split!r}: built-in datasets have 'train' and 'val'")
            files.append(str(materialize_builtin(entry) / f"{wanted}.parquet"))
            continue
        path = Path(entry).expanduser()
        if not path.is_file():
            raise DataError(
                f"data file {entry!r} does not exist (data.{split}_files). Give a parquet path, "
                f"or a built-in dataset such as builtin:tiny_digits or "
                "builtin:reasoning_gym/chain_sum; `polyrl data --help` writes files."
            )
        files.append(str(path))
    return files
