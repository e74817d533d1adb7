"""The recall tool's one lookup (historygraph.render.recall), shared by the proxy, historygraph mcp
and the framework adapters, and Session.recall."""

from __future__ import annotations

import pytest

from historygraph import MemoryStore, Session
from historygraph.render.recall import TOOL_NAME, USAGE, ids_of, openai_tool, recall_stored, recall_text

BIG, SMALL = "line\n" * 200, "line\n" * 150  # 400 and 300 tokens (o200k_base: "line" and "\n" one each)


def session() -> Session:
    s = Session("s", budget=500, policy="prune")
    s.add({"role": "user", "content": "Read both."})
    for cid, text in (("c1", BIG), ("c2", SMALL)):
        s.add({"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "read", "arguments": "{}"}}]})
        s.add({"role": "tool", "tool_call_id": cid, "content": text})
    return s


def test_session_recall_gives_what_the_placeholder_left_out():
    s = session()
    out = s.render()
    assert out[2]["content"].startswith("[tool result c1 omitted from this context (400 tokens)")
    assert s.recall("c1") == BIG  # the id the placeholder names
    assert s.recall("#1–#2") == 'message #1 (assistant):\n\ntool call c1: read {}\n\nmessage #2 (tool, tool result c1):\n' + BIG
    with pytest.raises(KeyError, match="no tool result with id 'nope' in session 's'"):
        s.recall("nope")


def test_recall_text_heads_several_cuts_long_ones_and_answers_bad_ids():
    g = session().store.graph("s")
    assert recall_text(g, ["c2"]) == SMALL
    assert recall_text(g, ["c2", "nope"]) == f"tool result c2:\n{SMALL}\n\ntool result nope:\n[no tool result with id 'nope' in session 's']"
    assert recall_text(g, ["c1"], max_tokens=100) == "line\n" * 50 + "\n[... cut: 100 of 400 tokens of tool result c1 shown]"
    assert recall_text(g, ["c2"], max_tokens=300) == SMALL  # exactly at the limit: whole
    assert recall_text(g, None) == recall_text(g, []) == USAGE


def test_ids_of_reads_json_or_objects():
    assert ids_of('{"ids": ["a", "b"]}') == ["a", "b"] and ids_of({"ids": "a"}) == ["a"]
    assert ids_of("not json") is None and ids_of('{"ids": [1]}') is None and ids_of(None) is None and ids_of("[]") is None


def test_recall_stored_reads_the_store_at_the_call():
    store = MemoryStore()
    assert recall_stored(store, "later", ["c1"]) == f"[{TOOL_NAME}: nothing of this conversation is stored yet]"
    s = Session("later", store=store)
    s.add({"role": "user", "content": "go"})
    s.add({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]})
    s.add({"role": "tool", "tool_call_id": "c1", "content": BIG})
    assert recall_stored(store, "later", ["c1"]) == BIG
    assert openai_tool()["function"]["name"] == TOOL_NAME == "historygraph_recall"
