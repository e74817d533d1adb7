"""What each rendering left out and why (issue 40): the omission stream of a stored session, written
by the library and the proxy, read back by the store, ``show --omitted`` and the session API."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from historygraph import Message, Session, render_messages
from historygraph.cli import app as cli_app
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.render.omissions import REASONS, expand, omission_record, spans
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.signals.tokens import TokenCounter
from historygraph.store import MemoryStore, SQLiteStore
from historygraph.traces import read_traces
from test_store import make_store, pg_dsn  # noqa: F401 (fixtures)

TRACE = "mini-swe-agent-deepseek/django__django-11099.traj.json"  # under the shared traces (the traces_dir fixture)
MARKER = re.compile(r"\[omitted: messages #(\d+)–#(\d+), tool calls: (\d+)")


def steps(n: int = 8, text_words: int = 5, result_lines: int = 100) -> list[dict]:
    """A user request, then ``n`` steps: an assistant message calling ``sh`` (id ``c<i>``) and its result
    of ``result_lines`` lines. Positions: user 0, assistant 2i+1, result 2i+2."""
    out: list[dict] = [{"role": "user", "content": "fix the bug"}]
    for i in range(n):
        out.append({"role": "assistant", "content": "step " + "think " * text_words,
                    "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]})
        out.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out{i} " + "line\n" * result_lines})
    return out


def session_of(messages: list[dict], **kw) -> Session:
    s = Session(**kw)
    for m in messages:
        s.add(m)
    return s


def test_spans_are_runs_of_consecutive_positions():
    import numpy as np

    assert spans(np.array([3, 4, 5, 9], dtype=np.int64)) == [[3, 5], [9, 9]]
    assert spans(np.array([1, 3], dtype=np.int64)) == [[1, 1], [3, 3]]
    assert spans(np.array([], dtype=np.int64)) == []


def test_a_window_policy_records_its_placeholders_with_ids_and_stored_tokens():
    # observation-masking shows the 5 newest of 8 results (SWE-agent's window, n = 5); each result is
    # ~200 tokens, so the 5 fit in B = 1500 beside the rest and the whole history (~1,800) does not:
    # c0, c1, c2 (positions 2, 4, 6) are placeholders. (cache_stable=False: the window itself; cache-stable
    # rendering, the default, re-selects at 0.75·B and leaves out more, tests/test_cache_stable.py)
    s = session_of(steps(), policy="observation-masking", budget=1500, cache_stable=False)
    s.render()
    shown = {p: m.rendered_as for m, p in zip(s.rendering.messages, s.rendering.positions)}
    assert [p for p, f in shown.items() if f == "placeholder"] == [2, 4, 6]  # the hand-derived window
    [record] = s.omitted()
    assert record["events"] == 17 and record["omitted"] == 3 and record["policy"] == "observation-masking"
    assert record["forms"] == {"placeholder": [2, 4, 6]} and record["dropped"] == []
    counter = TokenCounter()
    items = expand(record, s.store.graph("session"), counter)
    assert [(o.position, o.kind, o.id, o.reason) for o in items] == [
        (2, "tool_result", "c0", "placeholder"), (4, "tool_result", "c1", "placeholder"), (6, "tool_result", "c2", "placeholder")]
    # tokens: the stored result's size, what showing it complete would cost (100 lines: over 100 tokens)
    assert all(o.tokens == counter.count_message(s.store.graph("session").messages[o.position]) > 100 for o in items)


def test_dropped_steps_are_recorded_as_the_marker_names_them():
    # assistant texts of 200 words: the non-tool history exceeds B, so the oldest steps go behind one marker
    for policy in ("observation-masking", "contextrender", "learned"):
        s = session_of(steps(text_words=200, result_lines=50), policy=policy, budget=1200)
        s.render()
        [marker] = [MARKER.search(m.content) for m in s.rendering.messages if m.rendered_as == "marker"]
        first, last, n_calls = map(int, marker.groups())
        [record] = s.omitted()
        items = expand(record, s.store.graph("session"), TokenCounter())
        dropped = [o for o in items if o.reason == "dropped"]
        # what the model was told: messages #first–#last left out, n_calls tool calls among them
        assert [o.position for o in dropped] == list(range(first, last + 1)), policy
        assert [o.id for o in dropped if o.kind == "tool_result"] == [f"c{i}" for i in range(n_calls)], policy
        assert {o.kind for o in dropped} == {"assistant", "tool_result"}
        # learned brings steps back for their results with the text left out ("brief")
        briefs = [p for m, p in zip(s.rendering.messages, s.rendering.positions) if m.rendered_as == "brief"]
        assert [o.position for o in items if o.reason == "brief"] == briefs


def test_one_record_per_render_kept_across_reopening_a_sqlite_store(tmp_path):
    path = tmp_path / "hg.sqlite"
    msgs = steps(n=4, result_lines=150)
    s = Session("run", store=SQLiteStore(path), policy="observation-masking", budget=700)
    for m in msgs[:5]:
        s.add(m)
    s.render()  # queued, written with the next add
    for m in msgs[5:]:
        s.add(m)
    s.render()
    assert [r["events"] for r in s.omitted()] == [5, 9]
    with sqlite3.connect(path) as db:  # the first is stored, the second still queued
        assert db.execute("SELECT count(*) FROM omitted WHERE session_id = 'run'").fetchone() == (1,)
    s.store.close()  # writes the queue
    again = SQLiteStore(path)
    records = again.omitted("run")
    assert [r["events"] for r in records] == [5, 9]
    assert records[1]["omitted"] == len(s.rendering.omitted) and records[1]["history_tokens"] == s.rendering.history_tokens
    again.close()


def test_a_program_that_never_closes_its_store_keeps_its_records_at_exit(tmp_path):
    """The walkthrough's case: render_messages with a session on an SQLite store the program never
    closes. The record of its one render is only queued (it is written with the next append), so
    it must be written at interpreter exit; a closed store is no longer flushed then."""
    import subprocess
    import sys

    path = tmp_path / "hg.sqlite"
    script = (
        "import json, sys\n"
        "from historygraph import render_messages\n"
        "from historygraph.store import SQLiteStore\n"
        "msgs = json.loads(sys.argv[2])\n"
        "render_messages(msgs, budget=900, policy='observation-masking', session='lib', store=SQLiteStore(sys.argv[1]))\n"
        "closed = SQLiteStore(sys.argv[1] + '.closed')\n"
        "closed.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(path), json.dumps(steps(n=6, result_lines=150))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    store = SQLiteStore(path)
    [record] = store.omitted("lib")
    assert record["events"] == 13 and record["omitted"] > 0
    store.close()


def test_render_messages_with_a_session_records_and_without_one_does_not():
    store = MemoryStore()
    msgs = steps(n=6, result_lines=150)
    r = render_messages(msgs, budget=900, policy="observation-masking", session="lib", store=store, explain=True)
    [record] = store.omitted("lib")
    tool_items = [o.position for o in expand(record, store.graph("lib"), TokenCounter()) if o.kind == "tool_result"]
    assert tool_items == r.rendering.omitted and record["omitted"] == len(r.rendering.omitted) > 0
    render_messages(msgs, budget=900, policy="observation-masking")
    assert store.sessions() == ["lib"] and len(store.omitted("lib")) == 1


def test_a_failed_append_puts_the_queued_records_back():
    from historygraph.store import AppendConflict

    s = session_of(steps(n=2), policy="prune", budget=5000)
    s.render()
    with pytest.raises(AppendConflict):
        s.add({"role": "user", "content": "next"}, expected_length=99)
    assert len(s.omitted()) == 1
    s.add({"role": "user", "content": "next"})
    assert s.store._read_omitted("session") and len(s.omitted()) == 1


@pytest.mark.parametrize("policy", ["learned", "contextrender", "observation-masking", "prune"])
def test_every_omitted_result_of_a_real_trace_is_in_its_record(policy, traces_dir):
    """On a recorded mini-swe-agent run, at every 4th model call under B = 3000: the tool results a
    record lists are exactly the rendering's ``omitted`` (which the policy computes on its own)."""
    msgs = next(read_traces(traces_dir / TRACE)).messages
    pol, signals, counter = create(policy), Signals(), TokenCounter()
    seen_forms: set[str] = set()
    calls_at = [p for p, m in enumerate(msgs) if m.role == "assistant"]
    for n in calls_at[3::4]:
        graph = ContextGraph("t", msgs[:n])
        r = pol.render(graph, 3000, signals)
        record = json.loads(json.dumps(omission_record(r, len(graph))))  # as stored
        items = expand(record, graph, counter)
        assert [o.position for o in items if o.kind == "tool_result"] == r.omitted, n
        assert all(o.reason in REASONS for o in items)
        seen_forms |= {o.reason for o in items}
    assert seen_forms  # the trace does exceed B


def test_show_omitted_heading_stays_on_one_line_and_a_call_that_left_nothing_out_has_no_table(tmp_path):
    """A newcomer's narrow terminal showed the heading of a call with nothing omitted wrapped to
    the width of its empty table ("history 0 / tokens")."""
    path = tmp_path / "hg.sqlite"
    s = Session("small", store=SQLiteStore(path), policy="learned", budget=1000)
    s.add(Message("user", "hello"))
    s.render()
    s.store.close()
    out = CliRunner().invoke(cli_app, ["show", "small", "--omitted", "--store", str(path)], env={"COLUMNS": "60"})
    assert out.exit_code == 0, out.output
    assert "call 1: learned-stable at B = 1000, history 0 tokens, 0 tool results omitted of 1 message" in out.output
    assert "┏" not in out.output  # no empty table


def test_show_omitted_prints_a_table_per_call_and_json(tmp_path):
    path = tmp_path / "hg.sqlite"
    s = Session("run", store=SQLiteStore(path), policy="observation-masking", budget=1500, cache_stable=False)  # the window above
    for m in steps():
        s.add(m)
    s.render()
    s.store.close()
    runner = CliRunner()
    out = runner.invoke(cli_app, ["show", "run", "--omitted", "--store", str(path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "call 1: observation-masking at B = 1500" in out.output and "3 tool results omitted of 17 messages" in out.output
    assert re.search(r"│\s+4 │ tool_result │ c1\s+│\s+\d+ │ placeholder", out.output)
    assert "placeholder: not selected within B" in out.output
    js = runner.invoke(cli_app, ["show", "run", "--omitted", "--json", "--store", str(path)])
    data = json.loads(js.output)
    assert [o["id"] for o in data["calls"][0]["items"]] == ["c0", "c1", "c2"] and data["reasons"] == REASONS
    bad = runner.invoke(cli_app, ["show", "run", "--json", "--store", str(path)])
    assert bad.exit_code != 0 and "--json goes with --omitted" in bad.output


def test_the_proxy_names_the_omitted_count_and_the_record_in_headers():
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from fake_upstream import build_app

    app = create_app(ServerConfig(upstream="http://upstream/v1", store=":memory:", policy="observation-masking",
                                  budget=1500, calibrate=False, cache_stable=False))  # the window of the first test
    up = build_app()
    app.state.proxy.transport = httpx.ASGITransport(app=up)
    msgs = steps()

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            first = await c.post("/v1/chat/completions", json={"model": "m", "messages": msgs},
                                 headers={"X-HistoryGraph-Session": "a/b"})
            answer = first.json()["choices"][0]["message"]
            second = await c.post("/v1/chat/completions", json={"model": "m", "messages": msgs + [
                answer, {"role": "user", "content": "and now?"}]}, headers={"X-HistoryGraph-Session": "a/b"})
            record = await c.get(first.headers["x-historygraph-omitted-record"])
            return first, second, record

    first, second, record = asyncio.run(go())
    assert first.status_code == second.status_code == 200
    assert first.headers["x-historygraph-omitted"] == "3"
    assert first.headers["x-historygraph-omitted-record"] == "/api/sessions/a%2Fb/omitted"
    body = record.json()
    assert [c["call"] for c in body["calls"]] == [1, 2] and body["calls"][0]["events"] == 17
    assert [o["id"] for o in body["calls"][0]["items"]] == ["c0", "c1", "c2"]
    assert int(second.headers["x-historygraph-omitted"]) == body["calls"][1]["omitted"]
    assert body["calls"][1]["events"] == 19 and body["reasons"]["placeholder"] == REASONS["placeholder"]


def test_every_store_keeps_the_records_in_order_and_shares_them_once_written(make_store):  # noqa: F811
    a = make_store()
    a.create_session("s")
    a.append("s", Message("user", "hi"))
    a.record_omitted("s", {"events": 1, "n": 1})
    a.record_omitted("s", {"events": 1, "n": 2})
    b = make_store() if not isinstance(a, MemoryStore) else a  # a second instance on the same database
    assert [r["n"] for r in a.omitted("s")] == [1, 2]  # queued, read by the instance that has them
    a.append("s", Message("assistant", "hello"))  # written with the append
    a.record_omitted("s", {"events": 2, "n": 3})
    assert [r["n"] for r in b.omitted("s")] == ([1, 2] if b is not a else [1, 2, 3])
    a.flush()
    assert [r["n"] for r in b.omitted("s")] == [1, 2, 3] and [r["n"] for r in a.omitted("s")] == [1, 2, 3]
    for s in {id(a): a, id(b): b}.values():
        s.close()


def test_a_version_3_sqlite_store_gains_an_empty_omitted_table(tmp_path):

    from test_migrations import sqlite_at_version

    path = tmp_path / "v3.sqlite"
    with sqlite_at_version(path, 3) as db:
        db.execute("INSERT INTO sessions VALUES ('s', 0, '{}')")
        db.execute("""INSERT INTO events VALUES ('s', 0, '{"role": "user", "content": "hi"}')""")
    s = SQLiteStore(path)
    assert s.schema_version == 7 and s.omitted("s") == [] and s.messages("s")[0].content == "hi"
    s.close()
