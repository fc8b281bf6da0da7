"""The run's log file: where the details of an error go when the console shows one line.

Why: an error the user caused (a corrupt model file, a refused checkpoint, a full disk) is one
line on the console, but whoever debugs it later needs the whole chain of exceptions. That goes
to ``<trainer.default_local_dir>/polyrl_errors.log`` and the line ends by pointing there. A log
that cannot be written where it belongs (the disk that is full) is written to the temporary
folder instead; the line never points at a file that holds nothing.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback

from polyrl.errors import PolyrlError
from polyrl.fsutil import DiskFullError, disk_full_error, is_disk_full

RUN_LOG = "polyrl_errors.log"
#: Words of a message that already points at a log (a worker's error names its traceback's file).
_POINTERS = ("traceback in ", "details in ")

#: The folder of the run this process drives, once the trainer knows it (the CLI prints the
#: error after the trainer has unwound, so it cannot be handed down).
_run_folder: str | None = None


def use_run_folder(folder: str) -> None:
    """Keep details of this process's errors in ``folder`` (the run's output folder)."""
    global _run_folder
    _run_folder = os.path.abspath(folder)


def run_folder() -> str | None:
    return _run_folder


def keep(text: str, *, folder: str | None = None, name: str = RUN_LOG) -> str | None:
    """Append ``text`` (with a time stamp) to ``<folder>/<name>`` (default: the run's folder),
    else to the same name in the temporary folder; the path written, or None when neither
    could be."""
    entry = f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}\n{text.rstrip()}\n"
    folders = [f for f in (folder or _run_folder, tempfile.gettempdir()) if f]
    for where in folders:
        path = os.path.join(where, name)
        try:
            os.makedirs(where, exist_ok=True)
            _append(path, entry.encode("utf-8", "replace"))
        except OSError:
            continue
        return path
    return None


def _append(path: str, data: bytes) -> None:
    """Append ``data`` whole or not at all: a short write is cut back off, and a file this call
    created is removed again, so no reader finds a part of an entry (or an empty log)."""
    created = not os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    start = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        try:
            os.ftruncate(fd, start)
        finally:
            os.close(fd)
            if created:
                os.unlink(path)
        raise
    os.close(fd)


def error_line(exc: BaseException) -> str | None:
    """The one line the CLI prints for ``exc``: a :class:`PolyrlError`'s message, a full disk
    anywhere in the chain named as such; None for anything else (a bug: its traceback shows).
    When something caused it, the chain goes to the run's log and the line says where."""
    if is_disk_full(exc) and not isinstance(exc, DiskFullError):
        where = getattr(exc, "filename", None) or _run_folder or os.getcwd()
        exc = _caused(disk_full_error(str(where), "the run's output"), exc)
    elif not isinstance(exc, PolyrlError):
        return None
    line = " ".join(str(exc).split())
    if exc.__cause__ is None or any(pointer in line for pointer in _POINTERS):
        return line
    path = keep("".join(traceback.format_exception(exc)))
    return f"{line} (details in {path})" if path else line


def _caused(error: PolyrlError, cause: BaseException) -> PolyrlError:
    error.__cause__ = cause
    return error
