"""Shared fixtures. Real traces are read from ../shared/traces (never copied into the repo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("HISTORYGRAPH_TRACES", REPO.parent / "shared" / "traces"))


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared real-trace folder; tests that need it skip with a clear message when absent."""
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (set HISTORYGRAPH_TRACES to the shared/traces folder)")
    return TRACES
