#!/usr/bin/env bash
# Lint and type-check (set-up included): ruff over src, tests and bench (rules in pyproject.toml),
# mypy over the whole package (src/historygraph; settings in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench
.venv/bin/mypy
