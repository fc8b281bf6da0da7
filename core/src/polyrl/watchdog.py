"""Bound the waits that cannot be interrupted from Python: an import that blocks (a plugin that
opens a network connection or waits on a lock at import) holds the import lock, and no exception
can be raised into it. The only bounded answer is to end the process with one line naming what
blocked, which :func:`deadline` does from a timer thread.

The limit for importing a plugin's heavy implementation (an engine) is ``POLYRL_IMPORT_TIMEOUT_S``
(seconds, default 300: importing vLLM or DeepSpeed on a loaded machine takes a minute): an
environment variable, because plugins are imported before the config is composed. Plugin
entry-point modules and light implementations are imported with a shorter bound that abandons the
import instead of ending the process (:mod:`polyrl.plugin_import`).
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
    """The plugin import limit from ``POLYRL_IMPORT_TIMEOUT_S``."""
    return seconds_from_env(IMPORT_TIMEOUT_ENV, DEFAULT_IMPORT_TIMEOUT_S)


def seconds_from_env(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable ``name``, ``default`` when it
    is unset (one line when it is not a positive number)."""
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        from polyrl.errors import ConfigError

        raise ConfigError(f"{name}={text!r} must be a positive number of seconds")
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
