"""Ctrl-C and SIGTERM held back while the driver hands one call to every rank of a group.

The controller turns a stop signal into an exception raised wherever the driver happens to be.
Raised between two ranks' ``.remote()`` calls, it would leave a collective method started on some
ranks only: they wait in it for peers that never join, the graceful shutdown queues behind that
wait, and the stop ends by the grace deadline instead of cleanly. Dispatching a call to all ranks
takes milliseconds, so the signal is held for that long and then handled as usual.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT are recorded instead of handled; on leaving it the
    previous handlers are back and each recorded signal goes to its handler (a default action
    is taken by sending the signal again). Outside the main thread, where Python cannot change
    handlers, and for a handler not installed from Python, nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, FrameType | None]] = []

    def record(signum: int, frame: FrameType | None) -> None:
        caught.append((signum, frame))

    previous = {}
    for sig in STOP_SIGNALS:
        handler = signal.getsignal(sig)
        if handler is not None:  # None: set outside Python, cannot be put back
            previous[sig] = handler
            signal.signal(sig, record)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum, frame in caught:
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)
