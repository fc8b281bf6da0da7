"""A failure inside a worker reaches the user as one line; the traceback goes to a log file."""

from __future__ import annotations

from polyrl.workers.worker_group import remote_error_line


class FakeActorDied(Exception):
    """Ray's error for a constructor failure: its text is the remote traceback."""


def test_a_plain_remote_error_keeps_its_type_and_message() -> None:
    assert remote_error_line(ValueError("bad dtype 'bfloat17'")) == (
        "ValueError: bad dtype 'bfloat17'"
    )


def test_the_last_exception_line_of_a_remote_traceback_is_the_summary() -> None:
    text = (
        "The actor died because of an error raised in its creation task, ray::Worker.__init__()\n"
        "Traceback (most recent call last):\n"
        '  File "worker.py", line 90, in __init__\n'
        "    raise RoleError(\n"
        "polyrl.workers.worker.RoleError: building role 'rollout' failed: SafetensorError: "
        "invalid JSON in header\n"
    )
    assert remote_error_line(FakeActorDied(text)) == (
        "RoleError: building role 'rollout' failed: SafetensorError: invalid JSON in header"
    )
