"""The proxy renders as stably as the replay (issue 49 item 1): in a 60-call Claude Code-shaped
session (tests/claude_code_session.py) through ``historygraph serve``'s app, with its defaults
(``learned`` wrapped cache-stable, calibration and the proxy's breakpoints on) at a budget the
history passes, each forwarded history starts with the previous one except at a re-selection or a
minor collection (which keeps the old generation), and
two instances on one store serving the session in turn forward what one instance forwards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from historygraph.history.events import Message
from historygraph.history.sessions import same_event
from historygraph.providers import anthropic
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.store import SQLiteStore

import claude_code_session as cc
from test_store import pg_dsn  # noqa: F401  (the PostgreSQL fixture)

B = 16_000
CALLS = 60
HEADERS = {"x-api-key": "sk-ant-dummy", "anthropic-version": "2023-06-01", "X-HistoryGraph-Session": "cc"}


def unmarked(value: Any) -> Any:
    """``value`` without ``cache_control`` members: a breakpoint is where the cache may end, not
    part of the cached prompt (docs.anthropic.com/en/docs/build-with-claude/prompt-caching), and
    Claude Code moves its own at every call (tests/claude_code_session.py)."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def serve(store: Path | str, instances: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The session through ``instances`` proxy apps on one store (a SQLite path or a PostgreSQL
    DSN), in turn: the bodies the provider received and the answers' usage."""
    up, seen = cc.provider()
    apps = [create_app(ServerConfig(anthropic_upstream="http://provider", store=str(store), budget=B)) for _ in range(instances)]
    for app in apps:
        app.state.proxy.transport = httpx.ASGITransport(app=up)
    usage = cc.run([cc.asgi_client(app) for app in apps], CALLS, HEADERS, stream=True)  # streamed, as Claude Code asks
    for app in apps:
        app.state.proxy.store.close()
    return seen, usage


def test_a_60_call_claude_code_session_changes_its_forwarded_history_only_at_reselections(tmp_path):
    """Between re-selections each forwarded history starts with the previous one; a minor
    collection (policies/cache_stable.py, "Generations") rewrites only its young part, so the
    provider reads most of the request from the cache even there."""
    seen, usage = serve(tmp_path / "one.sqlite", 1)
    assert len(seen) == CALLS  # every request accepted by the provider's rules
    store = SQLiteStore(tmp_path / "one.sqlite")
    assert store.sessions() == ["cc"]  # the client's moved breakpoints never forked the session
    records = store.omitted("cc")
    store.close()
    assert len(records) == CALLS
    kinds = [r["cache_stable"] for r in records]
    assert kinds[0] == "reselected" and set(kinds) == {"reselected", "appended", "collected"}
    history = [[json.dumps(m, sort_keys=True) for m in unmarked(body["messages"])] for body in seen]
    for i in range(1, CALLS):
        if kinds[i] == "appended":
            assert history[i][:len(history[i - 1])] == history[i - 1], f"call {i} appended but rewrote the history"
    # the history passes B for the first time where the first re-selection or collection shows less than it holds
    first = next(i for i, r in enumerate(records) if r["omitted"] or r["dropped"])
    assert kinds[first] != "appended" and 20 <= first <= 35 and all(r["history_tokens"] <= r["budget"] for r in records)
    # after that first one (whose young generation is the whole session), a collection keeps the task
    # and what precedes its young part: the provider reads at least half of what it read the call before
    read = [u["cache_read_input_tokens"] for u in usage]
    collections = [i for i in range(first + 1, CALLS) if kinds[i] == "collected"]
    assert collections and all(read[i] >= read[i - 1] / 2 and history[i][:2] == history[i - 1][:2] for i in collections), \
        [(i, read[i - 1], read[i]) for i in collections]
    # then a re-selection renders to 0.75·B and the steps (about 300 to 1,500 tokens) fill the
    # remaining quarter of B (4,000 tokens) in 3 calls at least: at most one re-selection per 3 calls
    # (the 33,000-token read passes B alone: its call re-selects, 3 calls after the one before)
    later = [i for i in range(first + 1, CALLS) if kinds[i] == "reselected"]
    assert all(b - a >= 3 for a, b in zip([first] + later, later)), later
    assert len(later) <= (CALLS - first) // 3


def test_two_instances_on_one_store_serving_the_session_in_turn_forward_what_one_forwards(tmp_path):
    """The cache-stable state is kept in the store (policy_state, schema version 7): the two apps'
    forwarded request bodies are those one app forwards, byte for byte, breakpoints included, and
    the simulated cache bills them the same."""
    one, one_usage = serve(tmp_path / "one.sqlite", 1)
    two, two_usage = serve(tmp_path / "two.sqlite", 2)
    assert [json.dumps(b, sort_keys=True) for b in two] == [json.dumps(b, sort_keys=True) for b in one]
    assert two_usage == one_usage


def test_a_tail_block_whose_breakpoint_the_client_moved_is_the_same_event():
    """A text block Claude Code puts after a tool result (a ``<system-reminder>``) travels with the
    result (docs/proxy.md); marked while its message is among the last two, unmarked after: the
    same event, so the session goes on (before, it forked at every such message). A message stored
    before the mark was left out of its blocks still compares equal."""
    turn = [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}, {"type": "text", "text": "<system-reminder>x</system-reminder>"}]
    marked = turn[:1] + [{**turn[1], "cache_control": {"type": "ephemeral"}}]
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]}
    a = anthropic.to_canonical(None, [{"role": "user", "content": "go"}, call, {"role": "user", "content": marked}])[0][-1]
    b = anthropic.to_canonical(None, [{"role": "user", "content": "go"}, call, {"role": "user", "content": turn}])[0][-1]
    assert a.provider_blocks == b.provider_blocks == '[{"text":"<system-reminder>x</system-reminder>","type":"text"}]'
    stored_before = Message("tool", "ok", tool_call_id="t1", provider_blocks=json.dumps(
        [{"cache_control": {"type": "ephemeral"}, "text": "<system-reminder>x</system-reminder>", "type": "text"}]))
    assert same_event(stored_before, b) and not same_event(stored_before, Message("tool", "ok", tool_call_id="t1"))


def test_two_instances_on_one_postgresql_database_forward_what_one_forwards(tmp_path, pg_dsn):  # noqa: F811
    one, one_usage = serve(tmp_path / "one.sqlite", 1)
    two, two_usage = serve(pg_dsn, 2)
    assert [json.dumps(b, sort_keys=True) for b in two] == [json.dumps(b, sort_keys=True) for b in one]
    assert two_usage == one_usage
