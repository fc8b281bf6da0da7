"""Stop signals held back while a call is handed to every rank
(:func:`polyrl.workers.stop_signals.stop_signals_deferred`), then handled as usual."""

from __future__ import annotations

import os
import signal

import pytest

from polyrl.workers.stop_signals import stop_signals_deferred


class Stopped(BaseException):
    pass


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signum)


@pytest.fixture
def sigterm_raises_stopped():
    previous = signal.signal(signal.SIGTERM, _stop)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_signal_inside_is_handled_on_leaving(sigterm_raises_stopped) -> None:
    reached = []
    with pytest.raises(Stopped) as info, stop_signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        reached.append("after the signal")  # the block runs to its end first
    assert reached == ["after the signal"]
    assert info.value.args == (signal.SIGTERM,)
    assert signal.getsignal(signal.SIGTERM) is _stop  # the handler is back


@pytest.fixture
def ctrl_c_raises_keyboard_interrupt():
    """Python's own SIGINT handler: a suite started in the background (``nohup make test &``)
    inherits SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_inside_becomes_keyboard_interrupt_on_leaving(
    ctrl_c_raises_keyboard_interrupt,
) -> None:
    with pytest.raises(KeyboardInterrupt), stop_signals_deferred():
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_no_signal_changes_nothing(sigterm_raises_stopped) -> None:
    with stop_signals_deferred():
        pass
    assert signal.getsignal(signal.SIGTERM) is _stop
    with pytest.raises(Stopped):  # and the handler works as before
        os.kill(os.getpid(), signal.SIGTERM)


def test_an_ignored_signal_stays_ignored() -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with stop_signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
