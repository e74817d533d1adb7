"""ContextWeaver's validation layer: TestTracker, ValidationDetector and the prepended test summary.

Source: ContextWeaver §3.3 ("Validation and Test Layer") and Appendix F.1.

* :func:`parse_test_output` (the TestTracker's parser) reads one tool result and returns a
  :class:`TestRun` when it holds pytest or unittest output, else ``None``. It reads

  - pytest: the final summary line (``==== 3 failed, 70 passed, 2 warnings in 0.52s ====`` or the
    ``-q`` form without rules), verbose per-test lines (``path::test PASSED``), the short test
    summary (``FAILED path::test - msg``) and the tracebacks of the ``FAILURES``/``ERRORS``
    sections (one per ``____ name ____`` header);
  - unittest (and Django's runner, which prints the same format): ``Ran N tests in Xs``,
    ``OK (skipped=1)`` / ``FAILED (failures=1, errors=2)``, verbose per-test lines
    (``test_x (mod.Class.test_x) ... ok``) and the tracebacks under ``FAIL:``/``ERROR:`` headers.

  Counts come from the summary line when there is one (it is authoritative: output cut by
  ``head``/``tail`` may lose per-test lines), else from the per-test lines.
* :func:`validation_status` (the ValidationDetector) labels a step ``failed`` when its run has a
  failure or an error, ``passed`` when tests passed and none failed, and ``unknown`` otherwise:
  labels come only from test-suite output, so a reproduction script stays ``unknown`` (§3.3).
* :func:`supersedes` decides when a later run fixes an earlier failure (§3.3 "superseded
  pointer"): every test the earlier run failed by name that the later run ran now passes, at least
  one of them ran, and the later run failed none of them. An earlier failure without test names
  is superseded by a later *passing* run of the same command. (The paper gives no rule; this is
  ours.)
* :class:`TestTracker` keeps the latest outcome of every test seen in a session and writes the
  F.1 summary (``TEST STATUS:`` then one ``✓ name: PASSED`` / ``✗ name: FAILED`` line per test);
  :func:`test_summary` builds it from a message list and :func:`prepend_test_summary` puts it in
  front of the agent's next input, for library and proxy use alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from historygraph.history.events import Message

PASSED, FAILED, ERROR, SKIPPED = "PASSED", "FAILED", "ERROR", "SKIPPED"
STATUSES = ("passed", "failed", "unknown", "superseded")

_PYTEST_SUMMARY = re.compile(
    r"^(?:=+ )?((?:\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?|rerun)(?:, )?)+)"
    r" in [\d.]+s(?: \([^)]*\))?(?: =+)?\s*$", re.M)
_PYTEST_NO_TESTS = re.compile(r"^=+ no tests ran in [\d.]+s =+\s*$", re.M)
_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")
_PYTEST_LINE = re.compile(r"^(\S+\.py::.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?:\s+\[\s*\d+%\])?\s*$", re.M)
_PYTEST_SHORT = re.compile(r"^(FAILED|ERROR) (\S+\.py::.+?)(?: - .*)?\s*$", re.M)
_PYTEST_SECTION = re.compile(r"^=+ (FAILURES|ERRORS) =+\s*$", re.M)
_PYTEST_HEADER = re.compile(r"^_{3,} (.+?) _{3,}\s*$", re.M)
_RULE = re.compile(r"^=+ .* =+\s*$", re.M)

_UT_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s\s*$", re.M)
_UT_RESULT = re.compile(r"^(OK|FAILED)(?: \(([^)]*)\))?\s*$", re.M)
_UT_LINE = re.compile(r"^(\w+) \(([\w.]+)\)[^\n]*? \.\.\. (ok|FAIL|ERROR|skipped\b.*|expected failure|unexpected success)\s*$", re.M)
_UT_HEADER = re.compile(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)[^\n]*\n-{10,}\n", re.M)
_UT_END = re.compile(r"^(?:={10,}|-{10,})\s*$", re.M)


@dataclass(frozen=True)
class TestRun:
    """The parsed outcome of one test-suite run found in one tool result.

    Attributes:
        framework: ``"pytest"`` or ``"unittest"``.
        passed, failed, errors, skipped: counts (from the summary line when present).
        results: test id -> ``PASSED``/``FAILED``/``ERROR``/``SKIPPED`` for every test named in the
            output (pytest node ids; unittest ``module.Class.test`` ids).
        tracebacks: ``(test id or section header, traceback text)`` per failure section.
    """

    __test__ = False  # not a pytest test class

    framework: str
    passed: int
    failed: int
    errors: int
    skipped: int
    results: dict[str, str] = field(default_factory=dict)
    tracebacks: tuple[tuple[str, str], ...] = ()

    @property
    def failing(self) -> set[str]:
        return {t for t, o in self.results.items() if o in (FAILED, ERROR)}

    @property
    def passing(self) -> set[str]:
        return {t for t, o in self.results.items() if o == PASSED}


def _pytest(text: str) -> TestRun | None:
    results: dict[str, str] = {}
    for name, outcome in _PYTEST_LINE.findall(text):
        results[name] = {"XFAIL": SKIPPED, "XPASS": PASSED}.get(outcome, outcome)
    for outcome, name in _PYTEST_SHORT.findall(text):
        results.setdefault(name, outcome)
    summaries = _PYTEST_SUMMARY.findall(text)
    if summaries:
        counts: dict[str, int] = {}
        for n, kind in _PYTEST_COUNT.findall(summaries[-1]):
            counts[kind.rstrip("s") if kind.startswith("error") else kind] = int(n)
        passed = counts.get("passed", 0) + counts.get("xpassed", 0)
        failed, errors = counts.get("failed", 0), counts.get("error", 0)
        skipped = counts.get("skipped", 0) + counts.get("xfailed", 0)
    elif results or _PYTEST_NO_TESTS.search(text):
        outs = list(results.values())
        passed, failed, errors, skipped = (outs.count(k) for k in (PASSED, FAILED, ERROR, SKIPPED))
    else:
        return None
    return TestRun("pytest", passed, failed, errors, skipped, results, _pytest_tracebacks(text))


def _pytest_tracebacks(text: str) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for sec in _PYTEST_SECTION.finditer(text):
        end = _RULE.search(text, sec.end())
        body = text[sec.end():end.start() if end else len(text)]
        heads = list(_PYTEST_HEADER.finditer(body))
        for i, h in enumerate(heads):
            stop = heads[i + 1].start() if i + 1 < len(heads) else len(body)
            out.append((h.group(1), body[h.end():stop].strip("\n")))
    return tuple(out)


def _unittest(text: str) -> TestRun | None:
    ran = _UT_RAN.search(text)
    results: dict[str, str] = {}
    for method, where, outcome in _UT_LINE.findall(text):
        tid = where if where.endswith("." + method) else f"{where}.{method}"
        results[tid] = {"ok": PASSED, "FAIL": FAILED, "ERROR": ERROR, "unexpected success": PASSED}.get(
            outcome, SKIPPED)
    tracebacks = []
    for h in _UT_HEADER.finditer(text):
        method, where = h.group(2), h.group(3)
        tid = where if where.endswith("." + method) else f"{where}.{method}"
        results.setdefault(tid, FAILED if h.group(1) == "FAIL" else ERROR)
        end = _UT_END.search(text, h.end())
        tracebacks.append((tid, text[h.end():end.start() if end else len(text)].strip("\n")))
    if ran is None:
        if not results:
            return None
        outs = list(results.values())
        passed, failed, errors, skipped = (outs.count(k) for k in (PASSED, FAILED, ERROR, SKIPPED))
        return TestRun("unittest", passed, failed, errors, skipped, results, tuple(tracebacks))
    total = int(ran.group(1))
    res = _UT_RESULT.search(text, ran.end())
    counts = {k.strip(): int(v) for k, v in re.findall(r"([\w ]+)=(\d+)", res.group(2) or "")} if res else {}
    failed, errors = counts.get("failures", 0), counts.get("errors", 0)
    skipped = counts.get("skipped", 0) + counts.get("expected failures", 0)
    return TestRun("unittest", max(0, total - failed - errors - skipped), failed, errors, skipped, results, tuple(tracebacks))


def parse_test_output(text: str) -> TestRun | None:
    """The pytest or unittest run in ``text`` (a tool result), or ``None`` when there is none.

    When both formats appear (a script that runs both), the run with more tests wins.
    """
    runs = [r for r in (_pytest(text), _unittest(text)) if r is not None]
    if not runs:
        return None
    return max(runs, key=lambda r: r.passed + r.failed + r.errors + r.skipped)


def validation_status(run: TestRun | None) -> str:
    """The ValidationDetector's label for a step (§3.3): ``failed``, ``passed`` or ``unknown``."""
    if run is None:
        return "unknown"
    if run.failed or run.errors:
        return "failed"
    return "passed" if run.passed else "unknown"


def supersedes(later: TestRun, later_command: str, earlier: TestRun, earlier_command: str) -> bool:
    """True when ``later`` fixes the failure of ``earlier`` (rule in the module docstring)."""
    if validation_status(earlier) != "failed":
        return False
    broken = earlier.failing
    if not broken:
        return validation_status(later) == "passed" and later_command == earlier_command
    ran = broken & set(later.results)
    return bool(ran) and ran <= later.passing


class TestTracker:
    """The latest outcome of every test seen in a session, in order of first appearance.

    ``observe(run)`` records a run; ``summary()`` renders the F.1 block. Counts without test
    names (a non-verbose run) are shown as one line per run framework.
    """

    __test__ = False

    def __init__(self) -> None:
        self.latest: dict[str, str] = {}
        self.last_counts: dict[str, TestRun] = {}

    def observe(self, run: TestRun | None) -> None:
        if run is None:
            return
        for name, outcome in run.results.items():
            self.latest.pop(name, None)  # re-insert: newest results last
            self.latest[name] = outcome
        if not run.results:
            self.last_counts[run.framework] = run

    def summary(self, max_tests: int = 20) -> str:
        """``TEST STATUS:`` and one line per test (F.1), newest ``max_tests`` only; ``""`` if none."""
        lines = []
        for fw, r in self.last_counts.items():
            mark = "✗" if r.failed or r.errors else "✓"
            lines.append(f"{mark} {fw}: {r.passed} passed, {r.failed} failed, {r.errors} errors")
        for name, outcome in list(self.latest.items())[-max_tests:]:
            if outcome == SKIPPED:
                continue
            lines.append(f"{'✓' if outcome == PASSED else '✗'} {short_name(name)}: {outcome}")
        return "TEST STATUS:\n" + "\n".join(lines) if lines else ""


def short_name(test_id: str) -> str:
    """``tests/test_a.py::TestX::test_y[1]`` -> ``test_y[1]``; ``mod.Class.test_y`` -> ``test_y``."""
    if "::" in test_id:
        return test_id.rsplit("::", 1)[1]
    return test_id.rsplit(".", 1)[-1]


def test_summary(messages: Iterable[Message], max_tests: int = 20) -> str:
    """The F.1 test summary of a session's messages (all tool results, in order); ``""`` if none.

    For the library and the proxy: call it on the history before forwarding the next request.
    """
    tracker = TestTracker()
    for m in messages:
        if m.role == "tool":
            tracker.observe(parse_test_output(m.content))
    return tracker.summary(max_tests)


test_summary.__test__ = False  # type: ignore[attr-defined]


def prepend_test_summary(next_input: str, summary: str) -> str:
    """The agent's next input with the test summary in front (F.1 layout); unchanged if no summary."""
    return f"{summary}\n---\nQ: {next_input}" if summary else next_input

