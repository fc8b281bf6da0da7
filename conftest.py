"""The order in which the suite's test files are handed out (files with end-to-end runs, tests
marked ``slow``, first), and what no test may inherit from the tests before it in its process.

``make test`` spreads whole files over pytest-xdist processes (``--dist loadfile``) in collection
order (``--no-loadscope-reorder``: xdist would otherwise hand out the files with most tests first,
which leaves the one-test chaos and fault files for last). A long file handed out last keeps one
process busy after the others have run out of work, so the long ones go first and the many short
files fill the processes' gaps at the end.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file keeps its order


@pytest.fixture(autouse=True)
def _notices_as_in_a_fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config notice is logged once per process (``notice_once``); each test sees its own, as
    its own run would, whichever tests ran before it in the same process."""
    from polyrl.config.checks import checker

    monkeypatch.setattr(checker, "_noticed", set())
