#!/usr/bin/env bash
# The main job, in two parts, with the embedded SQLite store:
# 1. research traces: replay real agent traces through learned (also cache-stable), ContextRender, Prune, Full history and
#    the oracle at B = 6000 tokens. Uses ../shared/traces when present, else the example trace shipped with the package
#    (at B = 3000, where the example's history overflows). Writes replay-results/.
# 2. real sessions: six real Claude Code and Codex CLI session logs of ../shared/sessions (four with compactions) through
#    the same policies at B = 32000 beside the agent's own compaction (the `recorded` row) and its recorded bill. Writes
#    replay-results/sessions/. Skipped, saying so, without ../shared/sessions.
# Extra arguments are passed to both `historygraph replay` runs (e.g. --per-trace, --wide).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plots  # the replay and its figure need no other extra
TRACES=${HISTORYGRAPH_TRACES:-../shared/traces}
SESSIONS=${HISTORYGRAPH_SESSIONS:-../shared/sessions}
POLICIES=(-p learned -p learned-stable -p contextrender -p prune -p full -p oracle)
# one replay process per core, up to 4 (the same figures; on 2 cores about 1.15x faster than one process);
# a --jobs among the extra arguments comes later and wins
JOBS=$(.venv/bin/python -c 'import os; print(max(1, min(4, os.cpu_count() or 1)))')
status=0
if [ -d "$TRACES" ]; then
  .venv/bin/historygraph replay "$TRACES" "${POLICIES[@]}" --budget 6000 --out replay-results --jobs "$JOBS" "$@" || status=$?
else
  echo "no trace folder at $TRACES (relative to this clone; set HISTORYGRAPH_TRACES=PATH to replay yours): replaying the shipped example trace instead" >&2
  .venv/bin/historygraph replay "${POLICIES[@]}" --budget 3000 --out replay-results --jobs "$JOBS" "$@" || status=$?
fi
if [ -d "$SESSIONS" ]; then
  echo
  echo "real sessions: 4 Claude Code and 2 Codex CLI session logs of $SESSIONS at B = 32000 (all 50 at 16k/32k/64k: historygraph replay $SESSIONS)"
  FILES=()
  for f in claude-code/entireio__cli__deeac353-0765-4439-9056-293619a99172 claude-code/entireio__cli__847ff7d2-4a55-44d7-a3f5-a3afd89f1ee1 \
           claude-code/entireio__cli__ca8cc13b-d3df-4615-8f3f-f48a96b1a6f9 claude-code/entireio__cli__15b634ab-64a9-41da-92d3-685a0e4f2960 \
           codex/EntityProcess__agentv__019ed50c-2fb3-7002-a384-360bea6e7f04 codex/EntityProcess__agentv__019f15f7-b472-7bc3-8651-5547781e25cf; do
    FILES+=("$SESSIONS/$f.jsonl.gz")
  done
  .venv/bin/historygraph replay "${FILES[@]}" "${POLICIES[@]}" --budget 32000 --out replay-results/sessions --jobs "$JOBS" "$@" || status=$?
else
  echo "no session folder at $SESSIONS (set HISTORYGRAPH_SESSIONS=PATH, or replay your own: historygraph replay ~/.claude/projects): skipping the real-sessions part" >&2
fi
exit $status
