"""Malformed input (issue 6, input 11): each case gets a clear error or a documented pass-through.

| input                                  | behaviour                                                    |
|----------------------------------------|--------------------------------------------------------------|
| invalid JSON in tool-call arguments    | stored and rendered verbatim (what the model said)           |
| tool_call_id that matches nothing      | library: GraphError naming the id; readers: marked user msg  |
| duplicate call ids                     | library: GraphError; readers: renamed id#2 and remapped      |
| non-UTF-8 bytes in a trace file        | TraceFormatError naming the file                             |
| multimodal content parts (images)      | text parts kept, other parts become "[image_url]" markers    |
| empty content / null content + calls   | empty string                                                 |
| unknown role                           | EventError naming the role and the allowed ones              |
| role "developer" (OpenAI's new name)   | read as system                                               |
"""

import json

import pytest

from historygraph.history.events import EventError, Message, ToolCall
from historygraph.traces import TraceFormatError, read_traces
from historygraph.history.graph import ContextGraph, GraphError
from historygraph.policies import Signals, create
from historygraph.render import check_invariants


def test_invalid_json_arguments_pass_through():
    m = Message.from_openai({"role": "assistant", "content": None,
                             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]})
    assert m.content == "" and m.tool_calls[0].arguments == "{not json"
    g = ContextGraph("g", [Message("user", "u"), m, Message("tool", "r", tool_call_id="c1")])
    sig = Signals()
    r = create("prune").render(g, 6000, sig)
    check_invariants(r, g, sig.counter)
    assert r.to_openai()[1]["tool_calls"][0]["function"]["arguments"] == "{not json"


def test_unknown_call_id_and_duplicates_are_named():
    g = ContextGraph("g", [Message("user", "u"), Message("assistant", "", (ToolCall("c1", "f"),))])
    with pytest.raises(GraphError, match=r"message #2: tool result answers unknown tool_call_id 'zz'"):
        g.append(Message("tool", "r", tool_call_id="zz"))
    with pytest.raises(GraphError, match=r"message #2: tool call id 'c1' appears twice \(first in message #1\)"):
        g.append(Message("assistant", "", (ToolCall("c1", "f"),)))
    assert len(g) == 2  # nothing was added


def test_an_orphan_result_is_named_by_its_message_number_with_or_without_a_session(tmp_path):
    """render_messages, alone or with a stored session: the same words, the message number the
    session would give it (markers and `show --message` use it), and what to do; nothing stored."""
    from historygraph import open_store, render_messages

    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
            {"role": "tool", "tool_call_id": "c9", "content": "r"}]
    store = open_store(str(tmp_path / "s.sqlite"))
    for kw in ({}, {"session": "s1", "store": store}):
        with pytest.raises(GraphError) as exc:
            render_messages(msgs, budget=3000, **kw)
        assert str(exc.value).startswith("message #2: tool result answers unknown tool_call_id 'c9' (no earlier "
                                         "assistant message has a tool call with that id: send the assistant message")
    assert not store.has_session("s1")
    store.close()


def test_readers_repair_unknown_and_duplicate_ids(tmp_path):
    doc = {"format": "openai-chat", "messages": [
        {"role": "user", "content": "u"},
        {"role": "assistant", "tool_calls": [{"id": "d", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "d", "content": "first"},
        {"role": "assistant", "tool_calls": [{"id": "d", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "d", "content": "second"},
        {"role": "tool", "tool_call_id": "nobody", "content": "stray"},
    ]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    (trace,) = read_traces(p)
    assert [(m.role, m.tool_call_id) for m in trace.messages[1:5]] == [
        ("assistant", None), ("tool", "d"), ("assistant", None), ("tool", "d#2")]
    assert trace.messages[5].role == "user" and "stray" in trace.messages[5].content
    assert trace.meta["renamed_call_ids"] == 1 and trace.meta["orphan_results"] == 1


def test_non_utf8_file_is_named(tmp_path):
    p = tmp_path / "bad.json"
    p.write_bytes(b'{"format": "openai-chat", "messages": [{"role": "user", "content": "\xff\xfe"}]}')
    with pytest.raises(TraceFormatError, match="bad.json"):
        list(read_traces(p))


def test_multimodal_parts_are_flattened():
    m = Message.from_openai({"role": "user", "content": [
        {"type": "text", "text": "what is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]})
    assert m.content == "what is in this picture?\n[image_url]"


def test_empty_and_null_content():
    assert Message.from_openai({"role": "user", "content": ""}).content == ""
    assert Message.from_openai({"role": "assistant", "content": None}).content == ""


def test_unknown_role_is_named():
    with pytest.raises(EventError, match="'narrator' is not one of system, user, assistant, tool"):
        Message.from_openai({"role": "narrator", "content": "x"})
    assert Message.from_openai({"role": "developer", "content": "x"}).role == "system"


def test_adding_stored_messages_again_names_the_session_and_says_what_to_do(tmp_path):
    """A script run twice against a saved store: Session.add of the same messages names the session,
    the event, and that the session already holds the call (the walkthrough's bare 'event 0: … twice')."""
    from historygraph import Session, open_store

    msgs = [{"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "type": "function",
                                                                 "function": {"name": "f", "arguments": "{}"}}]}]
    store = open_store(str(tmp_path / "s.sqlite"))
    s = Session("lib-1", store=store)
    for m in msgs:
        s.add(m)
    with pytest.raises(GraphError, match=r"session 'lib-1', event 0 of the batch: tool call id 't1' appears twice "
                                         r"\(the session already holds it: add only messages it does not hold yet\)"):
        s.add(msgs[1])
    assert len(store.messages("lib-1")) == 2
    store.close()
