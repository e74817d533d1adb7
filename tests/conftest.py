"""Shared fixtures. Real traces are read from ../shared/traces (never copied into the repo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# LiteLLM (imported by its adapter and by mini-swe-agent) would fetch its model cost map at import
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
# tables are asserted at the CLI's piped width (170 columns); a developer's $COLUMNS would narrow them
os.environ.pop("COLUMNS", None)

# torch's CPU threads (SmolLM2) per test process: the cores divided among the pytest-xdist workers
# (1 each with `-n auto` on 2 cores). With torch's default of every core in each of 2 workers, its
# threads spin-wait at every operator for a peer that another process holds: one 24-token summary
# took 42–51 CPU s with 2 threads and 2.0 CPU s with 1 under the same load (bench/RESULTS.md,
# "Test suite"). Set in each worker (not in the controller, whose environment the workers inherit)
# before torch is imported; a value in the environment is kept; a run without xdist keeps torch's.
if "PYTEST_XDIST_WORKER" in os.environ:
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("HISTORYGRAPH_LLM_THREADS", _threads)

# The default store (a command without --store, a library call without store=) is a throwaway file
# per test process, never the user's (~/.local/share/historygraph): a test that forgot --store
# would otherwise leave its sessions in the store the main job and the user's commands read.
if "HISTORYGRAPH_DB" not in os.environ:
    import tempfile

    os.environ["HISTORYGRAPH_DB"] = str(Path(tempfile.mkdtemp(prefix="historygraph-tests-")) / "default.sqlite")

REPO = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("HISTORYGRAPH_TRACES", REPO.parent / "shared" / "traces"))


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared real-trace folder; tests that need it skip with a clear message when absent."""
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (set HISTORYGRAPH_TRACES to the shared/traces folder)")
    return TRACES


SESSIONS = Path(os.environ.get("HISTORYGRAPH_SESSIONS", REPO.parent / "shared" / "sessions"))


@pytest.fixture(scope="session")
def sessions_dir() -> Path:
    """The shared real Claude Code / Codex session logs (``claude-code/``, ``codex/``, gzip); tests
    that need them skip with a clear message when absent."""
    if not SESSIONS.is_dir():
        pytest.skip(f"real agent sessions not found at {SESSIONS} (set HISTORYGRAPH_SESSIONS to the shared/sessions folder)")
    return SESSIONS


# Hypothesis profiles: the default draws fresh random examples on every run; HYPOTHESIS_PROFILE=ci
# (set by .ci/run) draws the same examples every time, so CI cannot turn red by chance (bugs found
# by random runs become explicit tests); HYPOTHESIS_PROFILE=fuzz runs a long fuzzing pass;
# HYPOTHESIS_PROFILE=dev draws 10 fresh examples per property instead of 100, for the quick
# developer run (docs/tests.md: its random-history properties cost about 15 CPU s at 20); CI keeps
# the full count.
from hypothesis import settings as _settings  # noqa: E402

_settings.register_profile("ci", derandomize=True, deadline=None)
_settings.register_profile("fuzz", max_examples=5000, deadline=None)
_settings.register_profile("dev", max_examples=10, deadline=None)
_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# Tests that load the local language model (SmolLM2-135M) carry the `lm` mark (registered in
# pyproject.toml), so `pytest -m "not lm"` runs everything else. A test that uses the model without
# the mark is listed at the end of the run. The finding travels as a user property of the test's
# report, so the list is complete under pytest-xdist too (each worker's reports reach the controller).
_UNMARKED_LM: list[str] = []
_UNMARKED_LM_PROPERTY = "loads_smollm2_without_lm_mark"


@pytest.fixture(autouse=True)
def _record_language_model_use(request, monkeypatch):
    try:
        from historygraph.models import smollm2
    except ImportError:
        yield
        return
    original = smollm2.load_smollm2

    def recording():
        props = request.node.user_properties
        if request.node.get_closest_marker("lm") is None and (_UNMARKED_LM_PROPERTY, True) not in props:
            props.append((_UNMARKED_LM_PROPERTY, True))
        return original()

    monkeypatch.setattr(smollm2, "load_smollm2", recording)
    yield


def pytest_runtest_logreport(report):
    if (_UNMARKED_LM_PROPERTY, True) in report.user_properties and report.nodeid not in _UNMARKED_LM:
        _UNMARKED_LM.append(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    # skipped tests, one line per reason with the count and the files (scripts/test.sh runs without
    # -rs, which lists each skipped test: 36 lines of the same PostgreSQL reason buried the summary)
    by_reason: dict[str, list[str]] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        by_reason.setdefault(reason.removeprefix("Skipped: "), []).append(report.nodeid.split("::")[0])
    for reason, files in sorted(by_reason.items()):
        where = ", ".join(sorted(set(files), key=files.index))
        terminalreporter.write_line(f"skipped {len(files)}: {reason} ({where})")
    if _UNMARKED_LM:
        terminalreporter.write_line("tests that load SmolLM2-135M without the lm mark (add @pytest.mark.lm):")
        for nodeid in _UNMARKED_LM:
            terminalreporter.write_line(f"  {nodeid}")


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """The fake provider (tests/fake_upstream.py) as a process of its own: its base URL, for the tests
    that build the proxy in-process in front of it (test_disk_full, test_media, test_proxy_robustness)."""
    from test_server import FAKE, _port, _start

    port = _port()
    proc = _start([FAKE, "--port", str(port)], port, tmp_path_factory.mktemp("fake") / "upstream.log")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)
