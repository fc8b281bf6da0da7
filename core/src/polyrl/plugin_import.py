"""Import a plugin's code so that nothing it does at import can end or hold the importing process.

A plugin module may raise anything while it imports, ``SystemExit`` and ``KeyboardInterrupt``
included (``sys.exit(3)`` at module level would otherwise end ``polyrl plugins`` with status 3 and
no output), and it may block for ever (a network call, a lock). :func:`run_bounded` runs the
import in a daemon thread and waits for it a bounded time:

- whatever the plugin's code raises comes back as :class:`PluginCodeRaised` (an ``Exception``),
  so the caller records the plugin as broken; a Ctrl-C of the user still reaches the main thread
  as ``KeyboardInterrupt``, because signals are only delivered there;
- an import that has not finished within the bound is abandoned (:class:`PluginImportBlocked`):
  no exception can be raised into a blocked thread, so it is left behind, as a daemon that does
  not keep the process alive, and the module is never used.

The bound for plugin entry-point modules and light implementations is
``POLYRL_PLUGIN_DISCOVERY_TIMEOUT_S`` (seconds, default 20): they must stay light (no torch at
import), so anything longer is a plugin bug. Heavy engine imports keep their own, longer bound
(:data:`polyrl.watchdog.IMPORT_TIMEOUT_ENV`).

An abandoned import is recorded in ``POLYRL_ABANDONED_PLUGIN_IMPORTS`` of this process's
environment, which the processes it starts (Ray workers, reward workers) inherit: they skip that
module at once instead of each waiting out the bound again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

from polyrl.watchdog import seconds_from_env

DISCOVERY_TIMEOUT_ENV = "POLYRL_PLUGIN_DISCOVERY_TIMEOUT_S"
DEFAULT_DISCOVERY_TIMEOUT_S = 20.0
ABANDONED_ENV = "POLYRL_ABANDONED_PLUGIN_IMPORTS"

T = TypeVar("T")


class PluginCodeRaised(Exception):
    """The plugin's code raised ``cause`` (any ``BaseException``) while it ran."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(describe(cause))
        self.cause = cause


class PluginImportBlocked(Exception):
    """The plugin's code did not finish within the bound and was abandoned."""


def describe(exc: BaseException) -> str:
    """``Type: message``, saying what an exit or an interrupt raised by the plugin itself means."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: {exc.code} (the module calls sys.exit while it is imported)"
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt (raised by the module itself while it is imported)"
    return f"{type(exc).__name__}: {exc}"


def discovery_timeout_s() -> float:
    """The bound for importing a plugin's light code (``POLYRL_PLUGIN_DISCOVERY_TIMEOUT_S``)."""
    return seconds_from_env(DISCOVERY_TIMEOUT_ENV, DEFAULT_DISCOVERY_TIMEOUT_S)


def run_bounded(body: Callable[[], T], timeout_s: float) -> T:
    """``body()`` run in a daemon thread: its result, :class:`PluginCodeRaised` for whatever it
    raised, or :class:`PluginImportBlocked` once ``timeout_s`` has passed without an answer."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = body()
        except BaseException as exc:  # noqa: BLE001 - the plugin's own exit or interrupt included
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="polyrl-plugin-import", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise PluginImportBlocked(f"did not finish importing within {timeout_s:g} s")
    if "error" in outcome:
        raise PluginCodeRaised(outcome["error"])  # type: ignore[arg-type]
    return outcome["value"]  # type: ignore[return-value]


def abandoned_imports() -> set[str]:
    """Modules whose import this process, or the one that started it, abandoned."""
    return {item for item in os.environ.get(ABANDONED_ENV, "").split(",") if item}


def record_abandoned(module: str) -> None:
    """Remember ``module`` as abandoned, for this process and the processes it starts."""
    os.environ[ABANDONED_ENV] = ",".join(sorted(abandoned_imports() | {module}))
