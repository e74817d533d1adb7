"""Shared fixtures. Real traces are read from ../shared/traces (never copied into the repo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# LiteLLM (imported by its adapter and by mini-swe-agent) would fetch its model cost map at import
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

REPO = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("HISTORYGRAPH_TRACES", REPO.parent / "shared" / "traces"))


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared real-trace folder; tests that need it skip with a clear message when absent."""
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (set HISTORYGRAPH_TRACES to the shared/traces folder)")
    return TRACES


# Hypothesis profiles: the default draws fresh random examples on every run; HYPOTHESIS_PROFILE=ci
# (set by .ci/run) draws the same examples every time, so CI cannot turn red by chance (bugs found
# by random runs become explicit tests); HYPOTHESIS_PROFILE=fuzz runs a long fuzzing pass.
from hypothesis import settings as _settings  # noqa: E402

_settings.register_profile("ci", derandomize=True, deadline=None)
_settings.register_profile("fuzz", max_examples=5000, deadline=None)
_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# Tests that load the local language model (SmolLM2-135M) carry the `lm` mark (registered in
# pyproject.toml), so `pytest -m "not lm"` runs everything else. A test that uses the model without
# the mark is listed at the end of the run.
_UNMARKED_LM: list[str] = []


@pytest.fixture(autouse=True)
def _record_language_model_use(request, monkeypatch):
    try:
        from historygraph.models import smollm2
    except ImportError:
        yield
        return
    original = smollm2.load_smollm2

    def recording():
        if request.node.get_closest_marker("lm") is None and request.node.nodeid not in _UNMARKED_LM:
            _UNMARKED_LM.append(request.node.nodeid)
        return original()

    monkeypatch.setattr(smollm2, "load_smollm2", recording)
    yield


def pytest_terminal_summary(terminalreporter):
    if _UNMARKED_LM:
        terminalreporter.write_line("tests that load SmolLM2-135M without the lm mark (add @pytest.mark.lm):")
        for nodeid in _UNMARKED_LM:
            terminalreporter.write_line(f"  {nodeid}")
