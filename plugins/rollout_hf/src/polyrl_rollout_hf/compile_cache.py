"""Where torch.compile keeps what it built, so that a second run of the same shape loads it.

Why: Inductor and Triton cache their compiled graphs and kernels on disk, keyed by the traced
graph (shapes, dtypes), the compile settings and the torch/Triton versions, but by default in
``/tmp/torchinductor_<user>``: a folder under a world-writable directory, which another user could
create first and fill, and which many machines empty at boot. Here the cache is the user's own
folder, ``$XDG_CACHE_HOME/polyrl/inductor/torch-<version>`` (``~/.cache`` by default), created
private (0700) and used only while it is owned by this user and writable by no one else; it is
safe to delete. A cache folder the user chose (``TORCHINDUCTOR_CACHE_DIR``) is left as it is.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_root() -> Path:
    """The user's cache folder for compiled artefacts of this torch version."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    version = torch.__version__.replace("+", "-")
    return Path(base) / "polyrl" / "inductor" / f"torch-{version}"


def unsafe_reason(folder: Path) -> str | None:
    """Why ``folder`` (and the polyrl folders above it) must not be loaded from, or None."""
    for path in (folder, *folder.parents[:2]):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            return f"{path} is a symbolic link"
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return f"{path} belongs to another user (uid {info.st_uid})"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def use_compile_cache() -> str:
    """Point Inductor (and Triton, which follows it) at the user's private cache folder, unless
    the user chose one; returns the folder in use. A folder that fails the safety checks is
    replaced by a fresh private temporary one (nothing is loaded from it; a warning says why)."""
    chosen = os.environ.get(ENV)
    if chosen and chosen != _torch_default():
        return chosen
    folder = cache_root()
    try:
        folder.parents[2].mkdir(mode=0o700, parents=True, exist_ok=True)  # the cache home
        for path in (*reversed(folder.parents[:2]), folder):
            path.mkdir(mode=0o700, exist_ok=True)
        reason = unsafe_reason(folder)
    except OSError as err:
        reason = f"it could not be created ({err})"
    if reason is not None:
        logger.warning(
            "hf rollout: not caching compiled kernels in %s: %s; compiling into a private "
            "temporary folder instead",
            folder,
            reason,
        )
        folder = Path(tempfile.mkdtemp(prefix="polyrl-inductor-"))
    os.environ[ENV] = str(folder)
    return str(folder)


def _torch_default() -> str:
    """The folder torch picks when none is set (it writes it into the environment on use)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())
