#!/usr/bin/env bash
# Installs the real agent programs that the `clients` test group (tests/clients/, docs/tests.md)
# drives through `historygraph serve`, each at a pinned version, into .clients/ (gitignored):
#   .clients/npm       Claude Code, the Codex CLI and Gemini CLI (npm install --prefix)
#   .clients/aider     aider in a venv of its own (it pins many packages that clash with .venv)
#   .clients/smolagents smolagents with its OpenAI model class in a venv of its own
#   .clients/openhands the OpenHands SDK and its tools in a venv of its own (Python 3.12 or newer)
#   .clients/opencode  opencode (npm install --prefix of its own: a platform binary of about 180 MB)
#   .clients/llm       Simon Willison's llm CLI in a venv of its own
# mini-swe-agent, LangChain and the OpenAI Agents SDK come with .venv (the test extra).
# Idempotent: a client already at its pinned version is left as it is. Progress goes to stderr,
# one line per step, on a terminal or not. A client that cannot be installed (no npm, no Python
# 3.12) is reported and skipped; its tests then skip naming this script.
set -euo pipefail
cd "$(dirname "$0")/.."

CLAUDE_CODE=2.1.332     # npm @anthropic-ai/claude-code
CODEX=0.171.0           # npm @openai/codex
GEMINI_CLI=0.61.0       # npm @google/gemini-cli
AIDER=0.86.2            # pip aider-chat
OPENHANDS=1.58.2        # pip openhands-sdk and openhands-tools
SMOLAGENTS=1.26.0       # pip smolagents[openai]
OPENCODE=1.18.33        # npm opencode-ai
LLM=0.36                # pip llm
PY=${PYTHON:-python3}
PY312=${PYTHON312:-}

say() { echo "install-clients: $*" >&2; }
mkdir -p .clients

if command -v npm >/dev/null 2>&1; then
  want="@anthropic-ai/claude-code@$CLAUDE_CODE @openai/codex@$CODEX @google/gemini-cli@$GEMINI_CLI"
  if [ "$(cat .clients/npm/.pinned 2>/dev/null)" != "$want" ]; then
    say "npm: installing $want into .clients/npm"
    npm install --prefix .clients/npm --no-audit --no-fund --loglevel=error $want >&2
    echo "$want" > .clients/npm/.pinned
  fi
  say "npm: claude $(.clients/npm/node_modules/.bin/claude --version 2>/dev/null | head -1), codex $(.clients/npm/node_modules/.bin/codex --version 2>/dev/null | head -1), gemini $(.clients/npm/node_modules/.bin/gemini --version 2>/dev/null | head -1)"
  want="opencode-ai@$OPENCODE"
  if [ "$(cat .clients/opencode/.pinned 2>/dev/null)" != "$want" ]; then
    say "npm: installing $want into .clients/opencode"
    npm install --prefix .clients/opencode --no-audit --no-fund --loglevel=error "$want" >&2
    echo "$want" > .clients/opencode/.pinned
  fi
  say "npm: opencode $(.clients/opencode/node_modules/.bin/opencode --version 2>/dev/null | head -1)"
else
  say "npm not found: Claude Code, Codex, Gemini CLI and opencode are not installed (their tests skip)"
fi

# a venv of its own per Python client: .clients/NAME, with the packages PKGS (NAME==VERSION ...), by the Python given
venv_client() {
  local name=$1 pkg=$2 py=$3
  if [ "$(cat ".clients/$name/.pinned" 2>/dev/null)" != "$pkg" ]; then
    say "$name: creating .clients/$name and installing $pkg (a few minutes, quiet)"
    rm -rf ".clients/$name"
    "$py" -m venv ".clients/$name"
    # shellcheck disable=SC2086  # PKGS is a list of requirements
    ".clients/$name/bin/python" -m pip install -qq --disable-pip-version-check $pkg >&2
    echo "$pkg" > ".clients/$name/.pinned"
  fi
  say "$name: $(cat ".clients/$name/.pinned") in .clients/$name"
}

venv_client aider "aider-chat==$AIDER" "$PY"
venv_client smolagents "smolagents[openai]==$SMOLAGENTS" "$PY"
venv_client llm "llm==$LLM" "$PY"

# OpenHands SDK: Requires-Python >= 3.12; the first of PYTHON312, python3.12, python3.13 that runs
# (a pyenv shim of a version that is installed but not selected does not: its interpreter is tried)
if [ -z "$PY312" ]; then
  for cand in python3.12 python3.13 $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3 2>/dev/null); do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      PY312=$cand; break
    fi
  done
fi
if [ -n "$PY312" ]; then
  venv_client openhands "openhands-sdk==$OPENHANDS openhands-tools==$OPENHANDS" "$PY312"
else
  say "no Python 3.12 or newer (set PYTHON312=...): the OpenHands SDK is not installed (its tests skip)"
fi
say "done"
