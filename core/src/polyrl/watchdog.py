"""Bound the waits that cannot be interrupted from Python: an import that blocks (a plugin that
opens a network connection or waits on a lock at import) holds the import lock, and no exception
can be raised into it. The only bounded answer is to end the process with one line naming what
blocked, which :func:`deadline` does from a timer thread.

The limit for plugin imports is ``POLYRL_IMPORT_TIMEOUT_S`` (seconds, default 300: importing vLLM
or DeepSpeed on a loaded machine takes a minute): an environment variable, because plugins are
imported before the config is composed.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

IMPORT_TIMEOUT_ENV = "POLYRL_IMPORT_TIMEOUT_S"
DEFAULT_IMPORT_TIMEOUT_S = 300.0
#: Exit status of a process ended by :func:`deadline` (the CLI's status for an error).
EXIT_STUCK = 2


def import_timeout_s() -> float:
    """The plugin import limit from ``POLYRL_IMPORT_TIMEOUT_S`` (one line when it is not a
    positive number)."""
    text = os.environ.get(IMPORT_TIMEOUT_ENV, "")
    if not text:
        return DEFAULT_IMPORT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        from polyrl.errors import ConfigError

        raise ConfigError(f"{IMPORT_TIMEOUT_ENV}={text!r} must be a positive number of seconds")
    return value


@contextmanager
def deadline(what: str, fix: str, timeout_s: float) -> Iterator[None]:
    """Run the body; if it has not finished after ``timeout_s``, print ``error: <what> did not
    finish within N s; <fix>`` and end the process with :data:`EXIT_STUCK`."""

    def expire() -> None:
        sys.stderr.write(f"error: {what} did not finish within {timeout_s:g} s; {fix}\n")
        sys.stderr.flush()
        os._exit(EXIT_STUCK)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
