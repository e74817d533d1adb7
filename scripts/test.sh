#!/usr/bin/env bash
# Runs the test suite (set-up included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# pytest-xdist: one worker process per core, each taking the next test when it is free (worksteal);
# a caller's -n N (-n 0: one process) or -p no:xdist replaces it
par=(-n auto --dist worksteal)
case " $* " in
  *" -n"*|*" --numprocesses"*|*"no:xdist"*) par=() ;;
esac
# quiet by default; a -q or -v of the caller replaces it (two -q would hide the summary line)
case " $* " in
  *" -q"*|*" -v"*|*" --quiet"*|*" --verbose"*) exec .venv/bin/python -m pytest ${par[@]+"${par[@]}"} "$@" ;;
  *) exec .venv/bin/python -m pytest -q ${par[@]+"${par[@]}"} "$@" ;;
esac
