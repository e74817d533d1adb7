"""TestTracker, ValidationDetector and the F.1 summary (ContextWeaver §3.3, F.1)."""

from historygraph.history.events import Message, ToolCall
from historygraph.traces import read_traces
from historygraph.signals.test_output import (TestTracker, parse_test_output, prepend_test_summary, supersedes,
                                        test_summary, validation_status)

PYTEST_VERBOSE = """\
============================= test session starts ==============================
collecting ... collected 4 items

tests/test_auth.py::test_basic PASSED                                    [ 25%]
tests/test_auth.py::test_login_validation FAILED                         [ 50%]
tests/test_auth.py::TestToken::test_expiry[utc] PASSED                   [ 75%]
tests/test_auth.py::test_db ERROR                                        [100%]

==================================== ERRORS ====================================
__________________________ ERROR at setup of test_db ___________________________
    @pytest.fixture
>       conn = connect()
E       ConnectionError: refused
tests/conftest.py:9: ConnectionError
=================================== FAILURES ===================================
____________________________ test_login_validation _____________________________

    def test_login_validation():
>       assert validate("") is False
E       AssertionError: assert None is False

tests/test_auth.py:12: AssertionError
=========================== short test summary info ============================
FAILED tests/test_auth.py::test_login_validation - AssertionError: assert None...
ERROR tests/test_auth.py::test_db - ConnectionError: refused
=============== 1 failed, 2 passed, 1 error, 3 warnings in 0.31s ===============
"""

PYTEST_QUIET = """\
..F.s                                                                    [100%]
=========================== short test summary info ============================
FAILED tests/test_x.py::test_three - assert 1 == 2
1 failed, 3 passed, 1 skipped in 0.05s
"""

UNITTEST_VERBOSE = """\
test_add (calc.tests.CalcTests.test_add) ... ok
test_div (calc.tests.CalcTests.test_div) ... FAIL
test_pow (calc.tests.CalcTests.test_pow) ... ERROR
test_big (calc.tests.CalcTests.test_big) ... skipped 'slow'

======================================================================
ERROR: test_pow (calc.tests.CalcTests.test_pow)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "calc/tests.py", line 14, in test_pow
    pow_(2, "x")
TypeError: unsupported operand

======================================================================
FAIL: test_div (calc.tests.CalcTests.test_div)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "calc/tests.py", line 10, in test_div
    self.assertEqual(div(1, 2), 0.5)
AssertionError: 0 != 0.5

----------------------------------------------------------------------
Ran 4 tests in 0.002s

FAILED (failures=1, errors=1, skipped=1)
"""


def counts(run):
    return run.framework, run.passed, run.failed, run.errors, run.skipped


def test_pytest_verbose_counts_per_test_results_and_tracebacks():
    run = parse_test_output(PYTEST_VERBOSE)
    assert counts(run) == ("pytest", 2, 1, 1, 0)
    assert run.results == {"tests/test_auth.py::test_basic": "PASSED",
                           "tests/test_auth.py::test_login_validation": "FAILED",
                           "tests/test_auth.py::TestToken::test_expiry[utc]": "PASSED",
                           "tests/test_auth.py::test_db": "ERROR"}
    assert [name for name, _ in run.tracebacks] == ["ERROR at setup of test_db", "test_login_validation"]
    assert "E       AssertionError: assert None is False" in run.tracebacks[1][1]
    assert "short test summary" not in run.tracebacks[1][1]
    assert validation_status(run) == "failed"


def test_pytest_quiet_summary_without_rules():
    run = parse_test_output(PYTEST_QUIET)
    assert counts(run) == ("pytest", 3, 1, 0, 1)
    assert run.results == {"tests/test_x.py::test_three": "FAILED"}


def test_unittest_verbose_counts_results_and_tracebacks():
    run = parse_test_output(UNITTEST_VERBOSE)
    assert counts(run) == ("unittest", 1, 1, 1, 1)  # 4 ran − 1 failure − 1 error − 1 skipped
    assert run.results == {"calc.tests.CalcTests.test_add": "PASSED", "calc.tests.CalcTests.test_div": "FAILED",
                           "calc.tests.CalcTests.test_pow": "ERROR", "calc.tests.CalcTests.test_big": "SKIPPED"}
    assert [n for n, _ in run.tracebacks] == ["calc.tests.CalcTests.test_pow", "calc.tests.CalcTests.test_div"]
    assert run.tracebacks[1][1].endswith("AssertionError: 0 != 0.5")


def test_unittest_ok_line_and_non_test_output():
    run = parse_test_output("...\n----------------------------------------------------------------------\n"
                            "Ran 3 tests in 0.010s\n\nOK (skipped=1)\n")
    assert counts(run) == ("unittest", 2, 0, 0, 1) and validation_status(run) == "passed"
    # a reproduction script's traceback is not a test-suite run: the step stays unknown (§3.3)
    repro = 'Traceback (most recent call last):\n  File "reproduce.py", line 3\nValueError: bad\n'
    assert parse_test_output(repro) is None and validation_status(None) == "unknown"
    assert validation_status(parse_test_output("collected 0 items\n\n=== no tests ran in 0.01s ===\n")) == "unknown"


def test_superseding_needs_the_failed_tests_to_pass_later():
    failed = parse_test_output(PYTEST_VERBOSE)
    fixed = parse_test_output("tests/test_auth.py::test_login_validation PASSED\n"
                              "tests/test_auth.py::test_db PASSED\n=== 2 passed in 0.1s ===\n")
    half = parse_test_output("tests/test_auth.py::test_login_validation PASSED\n"
                             "tests/test_auth.py::test_db ERROR\n=== 1 passed, 1 error in 0.1s ===\n")
    other = parse_test_output("tests/test_other.py::test_z PASSED\n=== 1 passed in 0.1s ===\n")
    assert supersedes(fixed, "pytest", failed, "pytest")
    assert not supersedes(half, "pytest", failed, "pytest")
    assert not supersedes(other, "pytest", failed, "pytest")
    assert not supersedes(failed, "pytest", fixed, "pytest")  # a passing run has nothing to supersede
    nameless = parse_test_output("F.\n1 failed, 1 passed in 0.1s\n")
    green = parse_test_output("..\n2 passed in 0.1s\n")
    assert supersedes(green, "pytest -q", nameless, "pytest -q")
    assert not supersedes(green, "pytest -q tests/b.py", nameless, "pytest -q")


def test_tracker_summary_f1_and_prepending():
    tracker = TestTracker()
    tracker.observe(parse_test_output(PYTEST_VERBOSE))
    tracker.observe(parse_test_output("tests/test_auth.py::test_db PASSED\n=== 1 passed in 0.1s ===\n"))
    assert tracker.summary() == ("TEST STATUS:\n✓ test_basic: PASSED\n✗ test_login_validation: FAILED\n"
                                 "✓ test_expiry[utc]: PASSED\n✓ test_db: PASSED")
    assert prepend_test_summary("Fix the bug", "TEST STATUS:\n✓ a: PASSED") == "TEST STATUS:\n✓ a: PASSED\n---\nQ: Fix the bug"
    assert prepend_test_summary("Fix the bug", "") == "Fix the bug"
    msgs = [Message("user", "u"), Message("assistant", "", (ToolCall("c1", "bash", "{}"),)),
            Message("tool", UNITTEST_VERBOSE, tool_call_id="c1")]
    assert test_summary(msgs) == ("TEST STATUS:\n✓ test_add: PASSED\n✗ test_div: FAILED\n✗ test_pow: ERROR")


def test_real_pytest_runs_in_a_recorded_trace(traces_dir):
    """pvlib-1154 (mini-swe-agent): test_reindl errors at setup (position 117), then fails its
    assertion (123), then passes (127); counts read by hand from the summary lines."""
    trace = next(iter(read_traces(traces_dir / "mini-swe-agent-deepseek/pvlib__pvlib-python-1154.traj.json")))
    runs = {p: parse_test_output(trace.messages[p].content) for p in (117, 123, 127)}
    assert counts(runs[117]) == ("pytest", 0, 0, 1, 0)   # "2 warnings, 1 error in 0.06s"
    assert counts(runs[123]) == ("pytest", 0, 1, 0, 0)   # "1 failed, 2 warnings in 0.06s"
    assert counts(runs[127]) == ("pytest", 1, 0, 0, 0)   # "1 passed, 2 warnings in 0.02s"
    assert runs[123].results == {"pvlib/tests/test_irradiance.py::test_reindl": "FAILED"}
    assert runs[123].tracebacks[0][0] == "test_reindl" and "nan location mismatch" in runs[123].tracebacks[0][1]
    assert supersedes(runs[127], "", runs[123], "") and supersedes(runs[127], "", runs[117], "")
    assert not supersedes(runs[123], "", runs[117], "")


def test_real_unittest_run_in_a_recorded_trace(traces_dir):
    """django-11099 position 51: "Ran 2 tests", "OK", two verbose lines."""
    trace = next(iter(read_traces(traces_dir / "mini-swe-agent-deepseek/django__django-11099.traj.json")))
    run = parse_test_output(trace.messages[51].content)
    assert counts(run) == ("unittest", 2, 0, 0, 0)
    assert set(run.results) == {"__main__.UsernameValidatorsTests.test_ascii_validator",
                                "__main__.UsernameValidatorsTests.test_unicode_validator"}
