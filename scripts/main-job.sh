#!/usr/bin/env bash
# The main job: replay real agent traces through learned (also cache-stable), ContextRender, Prune, Full history and the oracle at
# B = 6000 tokens, with the embedded SQLite store. Uses ../shared/traces when present, else the
# example trace shipped with the package (at B = 3000, where the example's history overflows).
# Extra arguments are passed to `historygraph replay` (e.g. --policy all, --per-trace).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TRACES=${HISTORYGRAPH_TRACES:-../shared/traces}
# one replay process per core, up to 4 (the same figures; on 2 cores about 1.15x faster than one process);
# a --jobs among the extra arguments comes later and wins
JOBS=$(.venv/bin/python -c 'import os; print(max(1, min(4, os.cpu_count() or 1)))')
if [ -d "$TRACES" ]; then
  exec .venv/bin/historygraph replay "$TRACES" -p learned -p learned-stable -p contextrender -p prune -p full -p oracle --budget 6000 --out replay-results --jobs "$JOBS" "$@"
else
  echo "no trace folder at $TRACES (relative to this clone; set HISTORYGRAPH_TRACES=PATH to replay yours): replaying the shipped example trace instead" >&2
  exec .venv/bin/historygraph replay -p learned -p learned-stable -p contextrender -p prune -p full -p oracle --budget 3000 --out replay-results --jobs "$JOBS" "$@"
fi
