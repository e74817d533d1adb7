#!/usr/bin/env bash
# Runs the test suite (set-up included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# bytecode caches, pytest's rewritten test modules included, are written under __pycache__
# (gitignored) as Python does by default: with PYTHONDONTWRITEBYTECODE set (as on a machine whose
# environment sets it) every run recompiled every test module in each worker and the package in
# every server process it starts, about 2.5 CPU s per worker (docs/tests.md)
unset PYTHONDONTWRITEBYTECODE
# a test file or folder that does not exist: pytest-xdist's workers collect nothing and the run ends
# "no tests ran" without naming it, so say it here (exit status 4, pytest's for a usage error)
for a in "$@"; do
  case "$a" in
    tests/*|*.py|*.py::*) [ -e "${a%%::*}" ] || { echo "test.sh: no test file or folder $a (paths are relative to the repository root)" >&2; exit 4; } ;;
  esac
done
# pytest-xdist: one worker process per core, each taking the next test when it is free (worksteal);
# a caller's -n N (-n 0: one process) or -p no:xdist replaces it
par=(-n auto --dist worksteal)
case " $* " in
  *" -n"*|*" --numprocesses"*|*"no:xdist"*) par=() ;;
esac
# quiet by default; a -q or -v of the caller replaces it (two -q would hide the summary line). Skip
# reasons are printed one line per reason by tests/conftest.py, not per test as -rs would
case " $* " in
  *" -q"*|*" -v"*|*" --quiet"*|*" --verbose"*) exec .venv/bin/python -m pytest ${par[@]+"${par[@]}"} "$@" ;;
  *) exec .venv/bin/python -m pytest -q ${par[@]+"${par[@]}"} "$@" ;;
esac
