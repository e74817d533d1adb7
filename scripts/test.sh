#!/usr/bin/env bash
# Runs the test suite (set-up included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# quiet by default; a -q or -v of the caller replaces it (two -q would hide the summary line)
case " $* " in
  *" -q"*|*" -v"*|*" --quiet"*|*" --verbose"*) exec .venv/bin/python -m pytest "$@" ;;
  *) exec .venv/bin/python -m pytest -q "$@" ;;
esac
