"""Incremental routing of proxied requests (historygraph.history.sessions, "Incremental
comparison"): the prefix a router last stored is recognised without parsing it, an edit anywhere
is still found, and a session another process (another worker) appended to is re-read."""

from __future__ import annotations

import copy
import json

import msgspec
import pytest

from historygraph import Message
from historygraph.history.events import EventError
from historygraph.providers import jsonio
from historygraph.history.sessions import SessionRouter
from historygraph.providers.openai_chat import MessageError, RequestMessages
from historygraph.store import MemoryStore, SQLiteStore


def history(steps: int) -> list[dict]:
    out = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the parser."}]
    for i in range(steps):
        out.append({"role": "assistant", "content": f"step {i}",
                    "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]})
        out.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i}"})
    return out


def parsed(req: RequestMessages) -> list[int]:
    """Positions of the request's messages that were parsed."""
    return [i for i, m in enumerate(req._parsed) if m is not None]


def test_a_resent_history_is_parsed_only_where_it_is_new():
    router = SessionRouter(MemoryStore())
    raw = history(5)  # 12 messages
    first = RequestMessages(copy.deepcopy(raw))
    assert router.ingest(first, "s").appended == 12
    assert parsed(first) == list(range(12))
    # the client re-sends its history (new objects, equal JSON) plus the answer and a new result
    nxt = copy.deepcopy(raw) + [{"role": "assistant", "content": "done?"}, {"role": "user", "content": "go on"}]
    req = RequestMessages(nxt)
    got = router.ingest(req, "s")
    assert (got.session_id, got.appended, got.forked_from) == ("s", 2, None)
    assert parsed(req) == [12, 13]  # the 12 known messages were neither parsed nor compared
    assert [m.content for m in router.store.messages("s")][-2:] == ["done?", "go on"]


def unparsed(msgs: list[dict]) -> list:
    """The messages as the proxy's OpenAI endpoint reads them: each item's bytes, unparsed."""
    return jsonio.loads_request(json.dumps({"messages": msgs}).encode())[0]["messages"]


def test_a_resent_history_of_unparsed_messages_is_recognised_by_its_bytes():
    router = SessionRouter(MemoryStore())
    raw = history(5)
    first = RequestMessages(unparsed(raw))
    assert router.ingest(first, "s").appended == 12
    req = RequestMessages(unparsed(raw + [{"role": "assistant", "content": "done?"}, {"role": "user", "content": "go on"}]))
    assert (router.ingest(req, "s").appended, parsed(req)) == (2, [12, 13])
    # the same values in other bytes (keys in another order): parsed and compared, not a branch
    again = [dict(reversed(list(m.items()))) for m in raw] + [{"role": "assistant", "content": "done?"},
                                                              {"role": "user", "content": "go on"}, {"role": "user", "content": "?"}]
    req = RequestMessages(unparsed(again))
    got = router.ingest(req, "s")
    assert (got.session_id, got.appended, got.forked_from) == ("s", 1, None)
    assert parsed(req) == list(range(15))
    assert [m.content for m in router.store.messages("s")] == [m.content for m in req.parse_all()]


def test_an_unparsed_message_that_is_invalid_is_named():
    body = jsonio.loads_request(b'{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": 1e400}]}')[0]
    with pytest.raises(MessageError, match=r"messages\[1\]: content: a number JSON cannot carry"):
        RequestMessages(body["messages"])[1]  # out of msgspec's range: json's inf, refused by the check (issue 38.2)
    with pytest.raises(MessageError, match=r"messages\[0\]: not valid JSON"):
        RequestMessages([msgspec.Raw(b'{"role": ')])[0]


def test_an_edited_earlier_message_is_found_and_branches():
    router = SessionRouter(MemoryStore())
    raw = history(5)
    router.ingest(RequestMessages(copy.deepcopy(raw)), "s")
    edited = copy.deepcopy(raw) + [{"role": "user", "content": "next"}]
    edited[5]["content"] = "output 1, edited"  # a tool result in the middle
    req = RequestMessages(edited)
    got = router.ingest(req, "s")
    assert (got.session_id, got.forked_from) == ("s~1", "s")
    assert router.store.session_meta("s~1")["forked_at"] == 5  # compared event by event from the edit on
    assert router.store.messages("s")[5].content == "output 1"  # nothing stored was overwritten
    assert [m.content for m in router.store.messages("s~1")] == [m.content for m in req.parse_all()]
    # the branch is continued later: its own prefix is recognised; the edited message is parsed
    # once, to compare it with the root's event there
    more = RequestMessages(copy.deepcopy(edited) + [{"role": "assistant", "content": "ok"}])
    assert (router.ingest(more, "s").session_id, parsed(more)) == ("s~1", [5, 13])


def test_an_edit_that_parses_to_the_same_event_is_no_edit():
    # equality is that of the stored events (same_event), not of the JSON: a message re-sent as
    # a list of text parts instead of a string is the same turn, as without the cache
    router = SessionRouter(MemoryStore())
    raw = history(2)
    router.ingest(RequestMessages(copy.deepcopy(raw)), "s")
    again = copy.deepcopy(raw)
    again[1]["content"] = [{"type": "text", "text": "Fix the parser."}]
    got = router.ingest(RequestMessages(again + [{"role": "user", "content": "more"}]), "s")
    assert (got.session_id, got.appended) == ("s", 1)


def test_a_session_another_worker_appended_to_is_re_read(tmp_path):
    # two workers: two routers, each with its own store connection to one SQLite file
    path = tmp_path / "shared.sqlite"
    a, b = SessionRouter(SQLiteStore(path)), SessionRouter(SQLiteStore(path))
    raw = history(3)
    assert a.ingest(RequestMessages(copy.deepcopy(raw)), "s").appended == 8
    a.store.append("s", Message("assistant", "answer 1"))  # worker a stores the upstream's answer
    step2 = copy.deepcopy(raw) + [{"role": "assistant", "content": "answer 1"}, {"role": "user", "content": "u2"}]
    assert b.ingest(RequestMessages(step2), "s").appended == 1  # served by worker b (a cold cache)
    b.store.append("s", Message("assistant", "answer 2"))
    step3 = copy.deepcopy(step2) + [{"role": "assistant", "content": "answer 2"}, {"role": "user", "content": "u3"}]
    req = RequestMessages(step3)
    got = a.ingest(req, "s")  # back on worker a, whose cache knows only the first 8 messages
    assert (got.session_id, got.appended, got.forked_from) == ("s", 1, None)
    assert parsed(req) == [8, 9, 10, 11]  # compared with what b stored, from a's known prefix on
    assert [m.content for m in SQLiteStore(path).messages("s")][8:] == ["answer 1", "u2", "answer 2", "u3"]
    assert a.store.sessions() == ["s"]  # no branch


def test_an_invalid_new_message_names_its_index_and_stores_nothing():
    router = SessionRouter(MemoryStore())
    raw = history(2)
    router.ingest(RequestMessages(copy.deepcopy(raw)), "s")
    bad = copy.deepcopy(raw) + [{"role": "assistant", "content": "a"}, {"role": "robot", "content": "?"}]
    with pytest.raises(MessageError) as err:
        router.ingest(RequestMessages(bad), "s")
    assert err.value.index == 7 and str(err.value).startswith("messages[7]: role 'robot'")
    assert len(router.store.messages("s")) == 6


def test_the_prefix_cache_is_bounded():
    router = SessionRouter(MemoryStore(), prefix_cache=2)
    for sid in ("a", "b", "c"):
        router.ingest(RequestMessages(history(1)), sid)
    assert list(router._raw) == ["b", "c"]
    req = RequestMessages(history(1) + [{"role": "user", "content": "again"}])
    assert router.ingest(req, "a").appended == 1  # forgotten: compared in full, same result
    assert parsed(req) == list(range(5))


def _proxy_run(session_cache: int, steps: list[list[dict]]) -> tuple[list, list[dict]]:
    """Send each history to an in-process proxy (prune, B = 60) in front of a recording mock
    upstream; returns the status codes (the param named for a 400) and the bodies forwarded."""
    import asyncio

    import httpx

    from historygraph.server.app import create_app
    from historygraph.server.config import ServerConfig

    forwarded: list[dict] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        import json

        forwarded.append(json.loads(request.content))
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": "m", "created": 0,
                                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                      "finish_reason": "stop"}]})

    # cache-stable (the default): its state is kept in the store as well as with the graph, so a
    # graph rebuilt at every request (session_cache 0) extends the same rendering (issue 49)
    app = create_app(ServerConfig(upstream="http://upstream/v1", store=":memory:", policy="prune", budget=60,
                                  session_cache=session_cache, calibrate=False))
    app.state.proxy.transport = httpx.MockTransport(upstream)

    async def go() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            out = []
            for msgs in steps:
                r = await c.post("/v1/chat/completions", json={"model": "m", "messages": msgs},
                                 headers={"X-HistoryGraph-Session": "p"})
                out.append(r.status_code if r.status_code != 400 else r.json()["error"]["param"])
        return out

    return asyncio.run(go()), forwarded


def test_the_proxy_forwards_the_same_with_and_without_the_prefix_cache():
    base = history(4)
    steps = [base, base + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]]
    edited = copy.deepcopy(steps[1])
    edited[3]["content"] = "output 0, edited"
    steps.append(edited + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}])
    bad_new = copy.deepcopy(steps[-1]) + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": 5}]
    bad_known = copy.deepcopy(steps[-1]) + [{"role": "user", "content": "x"}]
    bad_known[9] = {"role": "user", "content": 7}  # an invalid message inside the prefix the cache knows
    steps += [bad_new, bad_known, steps[-1] + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "last"}]]
    with_cache, without = _proxy_run(256, steps), _proxy_run(0, steps)
    assert with_cache[0] == without[0] == [200, 200, 200, "messages[15]", "messages[9]", 200]
    assert with_cache[1] == without[1] and len(with_cache[1]) == 4


def test_the_store_keeps_at_most_graph_cache_graphs_and_rebuilds_a_dropped_one(tmp_path):
    store = SQLiteStore(tmp_path / "lru.sqlite")
    store.graph_cache = 2
    for sid in ("a", "b", "c"):
        store.create_session(sid)
        store.append(sid, [Message("user", f"task {sid}")])
    assert list(store._graphs) == ["b", "c"]  # a, least recently used, was dropped
    kept = store.graph("b")
    store.append("a", Message("assistant", "answer a"))  # rebuilt from the stored events, then appended
    assert [m.content for m in store.graph("a").messages] == ["task a", "answer a"]
    assert list(store._graphs) == ["b", "a"] and store.graph("b") is kept


def test_full_history_tokens_is_a_running_sum_equal_to_the_full_count():
    from historygraph import TokenCounter
    from historygraph.history.graph import ContextGraph
    from historygraph.server.metrics import full_history_tokens

    counter = TokenCounter()
    msgs = [Message.from_openai(m) for m in history(3)] + [Message("assistant", "done"), Message("user", "and now?")]
    graph = ContextGraph("g")
    for m in msgs:
        graph.append(m)
        current = max((p for p, x in enumerate(graph.messages) if x.role == "user"), default=None)
        expect = sum(counter.count_message(x) for p, x in enumerate(graph.messages) if x.role != "system" and p != current)
        assert full_history_tokens(graph, counter) == expect
    assert full_history_tokens(graph, counter) == full_history_tokens(ContextGraph("h", msgs), counter)


def anthropic_turns(steps: int) -> list[dict]:
    out: list[dict] = [{"role": "user", "content": "Fix the parser."}]
    for i in range(steps):
        out.append({"role": "assistant", "content": [{"type": "thinking", "thinking": f"t{i}", "signature": f"s{i}"},
                                                     {"type": "tool_use", "id": f"u{i}", "name": "bash", "input": {"i": i}}]})
        out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"u{i}", "content": f"output {i}"},
                                                {"type": "text", "text": f"and {i}"}]})
    return out


def test_the_anthropic_endpoint_converts_only_the_turns_it_has_not_seen(monkeypatch):
    from historygraph.providers import anthropic as anth
    from historygraph.server.convert import TurnCache

    converted: list[int] = []
    real = anth.turn_to_canonical
    monkeypatch.setattr(anth, "turn_to_canonical", lambda turn, i: converted.append(i) or real(turn, i))
    cache = TurnCache()

    def convert(turns: list[dict]) -> tuple[tuple, tuple, list[int]]:
        """(the cache's conversion, to_canonical's, the turns the cache converted)"""
        expect = anth.to_canonical("sys", turns)
        converted.clear()
        raw = jsonio.loads_request(json.dumps({"messages": turns}).encode())[0]["messages"]
        return cache.convert(TurnCache.key("s", "sys", raw), "sys", raw), expect, list(converted)

    # 7 turns -> system + 1 + 3 x (assistant, tool) = 8 messages: the text after each tool result
    # belongs to the tool loop (issue 36.3), kept with the result
    turns = anthropic_turns(3)
    first, expect, done = convert(turns)
    assert first == expect and len(first[0]) == 8 and done == list(range(7))
    more = turns + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}]
    got, expect, done = convert(more)
    assert got == expect and done == [7, 8]
    assert all(a is b for a, b in zip(got[0][1:], first[0][1:]))  # the same events: compared with the stored ones by identity
    edited = copy.deepcopy(more)
    edited[2]["content"][0]["content"] = "output 0, edited"  # a tool result in an earlier user turn
    got, expect, done = convert(edited)
    assert got == expect and done == list(range(2, 9))
    with pytest.raises(EventError, match=r"messages\[9\]\.role must be"):
        convert(edited + [{"role": "tool", "content": "x"}])


def test_ingest_gives_the_graph_holding_exactly_the_request(tmp_path):
    """Ingest.graph (what the proxy renders, without looking the session up again) holds the
    request's messages, also when the store's cache dropped the compared graph before the append
    (another session's request in another thread), and after a branch."""
    store = SQLiteStore(tmp_path / "ingest.sqlite")
    router = SessionRouter(store)
    raw = history(2)
    got = router.ingest(RequestMessages(copy.deepcopy(raw)), "s")
    assert got.graph is store.graph("s") and len(got.graph) == 6
    append = store.append

    def evicting_append(*args, **kwargs):  # the compared graph leaves the cache before the append
        store._graphs.clear()
        return append(*args, **kwargs)

    store.append = evicting_append
    step = copy.deepcopy(raw) + [{"role": "assistant", "content": "answer"}, {"role": "user", "content": "u2"}]
    got = router.ingest(RequestMessages(step), "s")
    assert [m.content for m in got.graph.messages][6:] == ["answer", "u2"] and len(got.graph) == 8
    store.append = append
    edited = copy.deepcopy(raw)
    edited[1]["content"] = "Fix the lexer."
    got = router.ingest(RequestMessages(edited), "s")
    assert got.forked_from == "s" and [m.content for m in got.graph.messages] == [m["content"] for m in edited]


def aider_request(task: str, file: str, done: list[tuple[str, str]] = ()) -> list[Message]:
    """An aider-shaped request (aider 0.86.2, as stored by tests/clients/test_aider.py): its system
    prompt and fixed example exchange, the chat so far, the file as it is now, the new turn."""
    opening = [Message("system", "Act as an expert software developer."), Message("user", "Change get_factorial() to use math.factorial"),
               Message("assistant", "To make this change we need to modify `mathweb/flask/app.py`"),
               Message("user", "I switched to a new code base."), Message("assistant", "Ok.")]
    chat = [m for u, a in done for m in (Message("user", u), Message("assistant", a))]
    files = [Message("user", f"I have *added these files to the chat*\nnotes.txt\n{file}"),
             Message("assistant", "Ok, any changes I propose will be to those files.")]
    return opening + chat + files + [Message("user", task)]


def test_two_chats_that_share_only_their_opening_get_their_own_sessions():
    router = SessionRouter(MemoryStore())
    a1 = router.ingest(aider_request("bump the version", "v0"))
    router.store.append(a1.session_id, Message("assistant", "edit v0 to v1\n"))  # what the proxy's store_answer does
    router.note_answer(a1.session_id, Message("assistant", "edit v0 to v1\n"))  # aider echoes it stripped
    # chat A's next request restates the file, as it is now, after the chat so far: a branch of chat A
    a2 = router.ingest(aider_request("the test failed", "v1", [("bump the version", "edit v0 to v1")]))
    assert (a2.session_id, a2.forked_from, a2.created) == (a1.session_id + "~1", a1.session_id, True)
    router.store.append(a2.session_id, Message("assistant", "edit v1 to v2"))
    router.note_answer(a2.session_id, Message("assistant", "edit v1 to v2"))
    # a second chat in the same repository: the same opening, and even the same file, but none of
    # chat A's answers: a chat of its own, not a branch of A
    b1 = router.ingest(aider_request("rename the file", "v2"))
    assert (b1.session_id, b1.forked_from, b1.created) == (a1.session_id + ".2", None, True)
    assert router.store.session_meta(b1.session_id) == {"opening": a1.session_id}
    router.store.append(b1.session_id, Message("assistant", "renamed"))
    router.note_answer(b1.session_id, Message("assistant", "renamed"))
    b2 = router.ingest(aider_request("thanks", "v2", [("rename the file", "renamed")]))
    assert (b2.session_id, b2.forked_from) == (b1.session_id + "~1", b1.session_id)
    # chat A goes on where it was: its newest answer routes it to its own branch
    a3 = router.ingest(aider_request("still failing", "v2", [("bump the version", "edit v0 to v1"), ("the test failed", "edit v1 to v2")]))
    assert (a3.session_id, a3.forked_from) == (a1.session_id + "~2", a2.session_id)
    # a request that continues a stored session by prefix is no new chat, whichever chat holds it
    b3 = router.ingest([*router.store.messages(b1.session_id), Message("user", "and?")])
    assert (b3.session_id, b3.appended, b3.created) == (b1.session_id, 1, False)
    # the header still wins: two requests named alike share their session whatever they hold
    h1 = router.ingest(aider_request("bump the version", "v0"), "named")
    h2 = router.ingest(aider_request("rename the file", "v0"), "named")
    assert (h1.session_id, h2.session_id, h2.forked_from) == ("named", "named~1", "named")
    # every chat of an opening is routed under one lock
    assert router.lock(b2.session_id) is router.lock(a1.session_id)


def test_answers_a_library_loop_appended_route_its_edits_to_its_chat():
    router = SessionRouter(MemoryStore())
    first = [Message("system", "s"), Message("user", "task")]
    s = router.ingest(first).session_id
    router.ingest([*first, Message("assistant", "answer one"), Message("user", "more")])  # appended by the client
    edited = router.ingest([*first, Message("assistant", "answer one"), Message("user", "more, edited")])
    assert (edited.session_id, edited.forked_from) == (s + "~1", s)
    other = router.ingest([*first, Message("assistant", "another answer"), Message("user", "more")])
    assert (other.session_id, other.forked_from) == (s + ".2", None)


def test_a_self_curating_clients_first_request_is_forwarded_as_sent_and_a_growing_chat_is_rendered():
    """At B = 60 (prune) an aider-shaped request's history (its example exchange and the file, about
    90 tokens) does not fit; it is what aider chose to send, forwarded as sent from the first
    request of a chat on, and marked so. A tool-free chat continuing its stored session by prefix
    is rendered under B as before."""
    import asyncio

    import httpx

    from historygraph.server.app import create_app
    from historygraph.server.config import ServerConfig

    forwarded: list[dict] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        forwarded.append(json.loads(request.content))
        answer = f"edit {len(forwarded)} " + "word " * 40
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": "m", "created": 0,
                                         "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                                      "finish_reason": "stop"}]})

    app = create_app(ServerConfig(upstream="http://upstream/v1", store=":memory:", policy="prune", budget=60, calibrate=False))
    app.state.proxy.transport = httpx.MockTransport(upstream)
    wire = lambda msgs: [m.to_openai() for m in msgs]  # noqa: E731

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            first = wire(aider_request("bump the version", "v0 " * 30))
            r1 = await c.post("/v1/chat/completions", json={"model": "m", "messages": first})
            answer = r1.json()["choices"][0]["message"]
            other = await c.post("/v1/chat/completions", json={"model": "m", "messages": wire(aider_request("rename it", "v0 " * 30))})
            grown = first + [answer] + [{"role": "user", "content": "and?"}]
            r3 = await c.post("/v1/chat/completions", json={"model": "m", "messages": grown})
            return [r1, other, r3]

    r1, other, r3 = asyncio.run(go())
    assert r1.headers["x-historygraph-context"] == "client-curated"
    assert forwarded[0]["messages"] == wire(aider_request("bump the version", "v0 " * 30))
    assert other.headers["x-historygraph-context"] == "client-curated"
    assert other.headers["x-historygraph-session"] == r1.headers["x-historygraph-session"] + ".2"
    assert "x-historygraph-context" not in r3.headers and r3.headers["x-historygraph-session"] == r1.headers["x-historygraph-session"]
    assert len(forwarded[2]["messages"]) < 10  # rendered under B: earlier turns dropped behind a marker
