"""Python files a user names in the config (a reward function, a sampler or dataset class, an
interaction, an agent function), imported as modules.

Each file is imported once per process, under a private module name made from its absolute path:
two files of the same name never collide, and a file named by two settings runs once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(path: str | Path, prefix: str) -> ModuleType:
    """The module of the ``.py`` file at ``path``, registered as ``<prefix>_<path digest>``.

    Raises ``FileNotFoundError`` for a missing file and whatever the file raises while it runs
    (callers turn both into a one-line error naming their config key)."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no file {file}")
    name = f"{prefix}_{hashlib.sha1(str(file).encode()).hexdigest()[:12]}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise ImportError(f"{file} cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]
