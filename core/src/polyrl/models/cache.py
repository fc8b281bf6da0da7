"""The model cache: where converted and built model folders live, and how one is built safely.

Why: a GGUF conversion takes tens of seconds and every worker process resolves the model path, so
the result is cached and shared. Several processes (Ray workers, two runs) may ask for the same
folder at the same moment; a folder is therefore built under a temporary name, renamed into place
when complete (an interrupted build never looks finished) and guarded by a lock file so that only
one process builds while the others wait and then reuse the result.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

CACHE_ENV_VAR = "POLYRL_CACHE_DIR"


def default_cache_dir() -> str:
    """``$POLYRL_CACHE_DIR`` when set, else ``~/.cache/polyrl``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return (
        os.path.expanduser(env)
        if env
        else os.path.join(os.path.expanduser("~"), ".cache", "polyrl")
    )


def is_hf_folder(path: str | os.PathLike[str]) -> bool:
    """A folder that ``from_pretrained`` can load: it holds a ``config.json``."""
    return os.path.isfile(os.path.join(path, "config.json"))


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock held while the body runs (blocks until it is free)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        try:
            import fcntl
        except ImportError:  # not POSIX: rely on the atomic rename alone
            yield
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def build_once(target: str | os.PathLike[str], build: Callable[[str], None]) -> str:
    """Return ``target`` once it is a complete HF folder, calling ``build(tmp_dir)`` if it is not.

    ``build`` writes the folder into the empty temporary directory it is given; the directory is
    renamed to ``target`` only after ``build`` returns. Concurrent callers wait on a lock file and
    re-check, so the folder is built at most once. A failed build leaves nothing behind.
    """
    target = Path(target)
    if is_hf_folder(target):
        return os.fspath(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.with_name(target.name + ".lock")):
        if is_hf_folder(target):  # another process finished it while we waited
            return os.fspath(target)
        if target.exists():  # a stray folder without config.json: not ours to trust
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by the user's runs
            build(os.fspath(tmp))
            if not is_hf_folder(tmp):
                raise RuntimeError(f"building {target} wrote no config.json into {tmp}")
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return os.fspath(target)
