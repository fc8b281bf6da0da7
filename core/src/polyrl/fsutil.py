"""Crash-safe file writes shared by the checkpoint manager and the metrics logger, and a full
disk named as such.

Why one place: both must leave readers either the old content or the new one, never a part,
across a crash or a power cut; the recipe (temporary file in the same folder, fsync, atomic
rename, fsync the folder) is easy to get subtly wrong, so it lives here once. A write that fails
for lack of space is reported as one line naming the path and the space left
(:func:`naming_full_disk`): Python's own ``OSError`` for it names no file when the failure comes
from a ``write`` or from a worker.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator

from polyrl.errors import PolyrlError


def fsync_path(path: str) -> None:
    """fsync a file or a directory (a directory's fsync makes renames/creations in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old content or the new, never a part:
    temporary file ``.<name>.<random>.tmp`` in the same folder, fsync, rename over, fsync the
    folder. The folder is created if missing."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_path(folder)


# ---- a full disk, named as such -----------------------------------------------------------------
class DiskFullError(PolyrlError):
    """A write failed with "No space left on device"; the message names where and the space
    left there."""


def _existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def free_space(path: str) -> str:
    """``"12.0 KiB free of 64.0 KiB"`` on the disk holding ``path`` (or its nearest existing
    folder); ``"free space unknown"`` where the disk cannot be asked."""
    try:
        usage = shutil.disk_usage(_existing_ancestor(path))
    except OSError:
        return "free space unknown"
    return f"{_size(usage.free)} free of {_size(usage.total)}"


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused by, ENOSPC: in this process (an ``OSError`` in the
    cause/context chain) or in a Ray worker (the remote exception as ``.cause``, or only its
    text in a wrapped error)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        if f"[Errno {errno.ENOSPC}]" in str(current):
            return True
        remote = getattr(current, "cause", None)
        if isinstance(remote, BaseException) and id(remote) not in seen:
            current = remote
            continue
        current = current.__cause__ or current.__context__
    return False


def disk_full_error(path: str, what: str) -> DiskFullError:
    """The one line for a full disk met while writing ``what`` to ``path``."""
    return DiskFullError(
        f"no space left on device writing {what} to {path} ({free_space(path)} on that disk): "
        "free some space there, or set trainer.default_local_dir to a folder on a disk with "
        "room; the checkpoints already complete are kept, and the same command resumes from "
        "the last one"
    )


#: Space below which a disk counts as full after a write to it failed (the failed write itself
#: has used up the rest).
NO_ROOM_BYTES = 1 << 20


def has_no_room(path: str) -> bool:
    """Whether the disk holding ``path`` has (almost) no space left for this user."""
    try:
        return shutil.disk_usage(_existing_ancestor(path)).free < NO_ROOM_BYTES
    except OSError:
        return False


@contextlib.contextmanager
def naming_full_disk(path: str, what: str) -> Iterator[None]:
    """Turn a write that failed for lack of space into :class:`DiskFullError` naming ``path``
    and its free space: ENOSPC raised by the body (here or in a worker), or any exception while
    the disk at ``path`` has no room left -- torch's zip writer reports a full disk as
    ``RuntimeError: ... unexpected pos``, without an errno. Interruptions and anything else pass
    unchanged."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        if is_disk_full(exc) or has_no_room(path):
            raise disk_full_error(path, what) from exc
        raise
