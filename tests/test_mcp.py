"""historygraph mcp: the official MCP client, in-process and over stdio against the real command."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.store import SQLiteStore

# slow: importing the MCP SDK costs about 1.3 CPU s in the process that runs these tests (docs/tests.md)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mcp_sdk() -> SimpleNamespace:
    """The official MCP client and our server. Imported here, not at module level: every test
    process collects this file, and importing the MCP SDK costs about 1.3 CPU s (docs/tests.md)."""
    pytest.importorskip("mcp", reason="mcp not installed (pip install -e '.[mcp]' in the clone)")
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from historygraph.integrations.mcp import build_server

    return SimpleNamespace(Client=Client, StdioServerParameters=StdioServerParameters, stdio_client=stdio_client,
                           build_server=build_server)


BIG = "\n".join(f"row {i}: invoice total {i * 3}" for i in range(300))
LOG = "ERROR connection refused to db.internal:5432\nretrying in 5 s"


def fill(store) -> None:
    store.create_session("run-1")
    store.append("run-1", [
        Message("user", "Why is the invoice job failing?"),
        Message("assistant", "", (ToolCall("c1", "read_csv", '{"f": "invoices.csv"}'), ToolCall("c2", "tail_log", "{}"))),
        Message("tool", BIG, tool_call_id="c1"),
        Message("tool", LOG, tool_call_id="c2"),
    ])


def test_tools_over_the_in_process_client(mcp_sdk, tmp_path):
    store = SQLiteStore(tmp_path / "s.sqlite")
    fill(store)

    async def run():
        async with mcp_sdk.Client(mcp_sdk.build_server(store, "run-1")) as c:
            names = sorted(t.name for t in (await c.list_tools()).tools)
            recalled = await c.call_tool("recall", {"ids": ["c1"]})
            both = await c.call_tool("recall", {"ids": ["c2", "nope"]})
            span = await c.call_tool("recall", {"ids": ["#3", "#1-#2"]})
            found = await c.call_tool("search", {"query": "connection refused", "limit": 3})
            listed = await c.call_tool("results", {})
            missing = await c.call_tool("results", {"session": "other"})
            return names, recalled, both, span, found, listed, missing

    names, recalled, both, span, found, listed, missing = asyncio.run(run())
    assert names == ["recall", "results", "search"]
    assert not recalled.is_error and recalled.content[0].text == BIG  # complete, byte for byte
    assert both.content[0].text == f"tool result c2:\n{LOG}\n\ntool result nope:\n[no tool result with id 'nope' in session 'run-1']"
    # the messages a dropped-step marker names, by number
    assert span.content[0].text == (f"messages #3:\nmessage #3 (tool, tool result c2):\n{LOG}\n\nmessages #1-#2:\n"
                                    f"message #1 (assistant):\n\ntool call c1: read_csv {{\"f\": \"invoices.csv\"}}\n"
                                    f"tool call c2: tail_log {{}}\n\nmessage #2 (tool, tool result c1):\n{BIG}")
    hits = found.structured_content["result"]
    assert [h["id"] for h in hits] == ["c2"] and hits[0]["first_line"].startswith("ERROR connection refused")
    rows = listed.structured_content["result"]
    assert [(r["id"], r["tool"]) for r in rows] == [("c1", "read_csv"), ("c2", "tail_log")]
    assert rows[0]["first_line"] == "row 0: invoice total 0"
    assert missing.is_error and "confined to session 'run-1'" in missing.content[0].text
    store.close()


def test_the_mcp_command_over_stdio(mcp_sdk, tmp_path):
    path = tmp_path / "s.sqlite"
    store = SQLiteStore(path)
    fill(store)
    store.close()
    params = mcp_sdk.StdioServerParameters(command=sys.executable,
                                           args=["-m", "historygraph", "mcp", "--store", str(path), "--session", "run-1"])

    errlog = tmp_path / "server.err"  # the server's stderr; not sys.stderr, which pytest may have swapped for an object without fileno()

    async def run():
        with errlog.open("w") as err:
            async with mcp_sdk.Client(mcp_sdk.stdio_client(params, errlog=err)) as c:
                return await c.call_tool("recall", {"ids": ["c2"]})

    r = asyncio.run(run())
    assert not r.is_error and r.content[0].text == LOG, errlog.read_text()


def test_the_command_names_a_missing_store(mcp_sdk, tmp_path):
    from typer.testing import CliRunner

    from historygraph.cli import app

    r = CliRunner().invoke(app, ["mcp", "--store", str(tmp_path / "missing.sqlite"), "--session", "run-1"])
    assert r.exit_code == 2 and "missing.sqlite" in r.output


def test_a_session_not_stored_yet_is_served_once_it_appears(mcp_sdk, tmp_path):
    """Issue 36, item 6: an agent is started with ``mcp --session S`` before its first request
    reaches the proxy. The command starts (saying the session is not stored yet), the tools answer
    for an empty session, and what is stored afterwards is read on the next call."""
    path = tmp_path / "s.sqlite"
    SQLiteStore(path).close()
    params = mcp_sdk.StdioServerParameters(command=sys.executable,
                                           args=["-m", "historygraph", "mcp", "--store", str(path), "--session", "run-1"])
    errlog = tmp_path / "server.err"

    async def run():
        with errlog.open("w") as err:
            async with mcp_sdk.Client(mcp_sdk.stdio_client(params, errlog=err)) as c:
                before = await c.call_tool("results", {})
                missing = await c.call_tool("recall", {"ids": ["c2"]})
                store = SQLiteStore(path)  # the proxy stores the session's first request
                fill(store)
                store.close()
                after = await c.call_tool("recall", {"ids": ["c2"]})
                return before, missing, after

    before, missing, after = asyncio.run(run())
    assert not before.is_error and before.structured_content == {"result": []}, errlog.read_text()
    assert "c2" in missing.content[0].text and "c2" not in (LOG,)
    assert not after.is_error and after.content[0].text == LOG
    assert "no session 'run-1'" in errlog.read_text() and "yet" in errlog.read_text()


def test_the_server_is_confined_to_its_session(mcp_sdk, tmp_path):
    """Issue 50: ``mcp --session pin-a`` answered ``recall``, ``search`` and ``results`` for
    ``session="pin-b"`` with another session's data, so a prompt-injected agent could read every
    session of the store. Confined by default; ``all_sessions=True`` (``--all-sessions``) allows it."""
    store = SQLiteStore(tmp_path / "s.sqlite")
    fill(store)
    store.create_session("pin-b")
    store.append("pin-b", [Message("user", "secret"), Message("assistant", "", (ToolCall("b2", "cat", "{}"),)),
                           Message("tool", "password=hunter2", tool_call_id="b2")])

    async def calls(server):
        async with mcp_sdk.Client(server) as c:
            return [await c.call_tool("recall", {"ids": ["b2"], "session": "pin-b"}),
                    await c.call_tool("search", {"query": "password", "session": "pin-b"}),
                    await c.call_tool("results", {"session": "pin-b"}),
                    await c.call_tool("results", {"session": "run-1"})]

    *other, own = asyncio.run(calls(mcp_sdk.build_server(store, "run-1")))
    for r in other:
        assert r.is_error and "hunter2" not in r.content[0].text
        assert "confined to session 'run-1'" in r.content[0].text and "--all-sessions" in r.content[0].text
    assert not own.is_error and [x["id"] for x in own.structured_content["result"]] == ["c1", "c2"]
    allowed = asyncio.run(calls(mcp_sdk.build_server(store, "run-1", all_sessions=True)))
    assert not any(r.is_error for r in allowed) and "hunter2" in allowed[0].content[0].text

    async def unknown():
        async with mcp_sdk.Client(mcp_sdk.build_server(store, all_sessions=True)) as c:
            return await c.call_tool("results", {"session": "other"}), await c.call_tool("results", {})

    other_missing, none_named = asyncio.run(unknown())
    assert other_missing.is_error and "no session 'other' in the store" in other_missing.content[0].text
    assert none_named.is_error and "no session given" in none_named.content[0].text
    with pytest.raises(ValueError, match="all_sessions"):
        mcp_sdk.build_server(store)  # no session to confine it to, and other sessions not allowed
    store.close()


def test_the_command_needs_a_session_or_all_sessions(mcp_sdk, tmp_path):
    from typer.testing import CliRunner

    from historygraph.cli import app

    path = tmp_path / "s.sqlite"
    SQLiteStore(path).close()
    r = CliRunner().invoke(app, ["mcp", "--store", str(path)])
    assert r.exit_code == 2 and "--session" in r.output and "--all-sessions" in r.output
