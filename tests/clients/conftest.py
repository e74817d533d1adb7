"""The ``clients`` group: real agent programs (installed by ``bash scripts/install-clients.sh``)
driven through ``historygraph serve`` against the fake provider; every test here carries the
``clients`` and ``slow`` marks (``-m clients`` runs the group, ``-m "not slow"`` skips it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import launch, stop

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE:
            item.add_marker(pytest.mark.clients)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def stacks(tmp_path_factory):
    """One fake provider, proxy and tap per budget, started on first use, kept for the session."""
    made: dict = {}

    def get(budget: int):
        if budget not in made:
            made[budget] = launch(budget, tmp_path_factory.mktemp(f"stack{budget}"))
        return made[budget]

    yield get
    for s in made.values():
        stop(s)


@pytest.fixture(params=[3000, 6000], ids=lambda b: f"B{b}")
def stack(request, stacks):
    """The stack at B = 3000 or 6000, its records cleared for this test."""
    s = stacks(request.param)
    s.reset()
    return s
