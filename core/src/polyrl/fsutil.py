"""Crash-safe file writes shared by the checkpoint manager and the metrics logger.

Why one place: both must leave readers either the old content or the new one, never a part,
across a crash or a power cut; the recipe (temporary file in the same folder, fsync, atomic
rename, fsync the folder) is easy to get subtly wrong, so it lives here once.
"""

from __future__ import annotations

import os
import tempfile


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
