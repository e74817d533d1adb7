"""How the proxy stores branches (issue 50): a client that restates its context before every new
turn (aider) forks a branch per request, and the branches share the events they have in common
with the session they fork from instead of copying them; and requests of one conversation in
flight together (three Claude Code sessions started at once) each get their answer stored in a
session of its own, never two answers in a row in one."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import replace

import httpx

from historygraph import Message
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig

OPENING = [{"role": "system", "content": "Act as an expert software developer."},
           {"role": "user", "content": "Change get_factorial() to use math.factorial"},
           {"role": "assistant", "content": "To make this change we need to modify `mathweb/flask/app.py`"},
           {"role": "user", "content": "I switched to a new code base."}, {"role": "assistant", "content": "Ok."}]


def aider_request(k: int) -> list[dict]:
    """aider's k-th request (0-based), shaped as aider 0.86.2 sends it (tests/clients/test_aider.py):
    its system prompt and fixed example exchange, the chat so far (each answer echoed back stripped
    of its trailing newline), the file as it is now (edited by every answer), the new turn."""
    done = [m for i in range(k) for m in ({"role": "user", "content": f"task {i}"}, {"role": "assistant", "content": f"edit v{i} to v{i + 1}"})]
    files = [{"role": "user", "content": f"I have *added these files to the chat*\nnotes.txt\nv{k}\n"},
             {"role": "assistant", "content": "Ok, any changes I propose will be to those files."}]
    return OPENING + done + files + [{"role": "user", "content": f"task {k}"}]


def chat_answer(content: str) -> httpx.Response:
    return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": "m", "created": 0,
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                                  "finish_reason": "stop"}]})


def test_an_aider_chat_stores_each_turns_new_events_once(tmp_path):
    """24 requests of 8, 10 … 54 messages (55 events with the last answer). Each request rewrites
    the file message before its new turn, so each forks a branch of the one before, at the end of
    the chat so far. Stored as copies, the branches held 9 + 11 + … + 55 = 768 events; sharing
    their common prefix, the root stores its 9 and each branch its 6 own: the two messages of the
    turn before, the file message and its answer, the new turn, and the new answer: 9 + 23 × 6 = 147."""
    path = tmp_path / "hg.sqlite"
    forwarded: list[list[dict]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        forwarded.append(json.loads(request.content)["messages"])
        k = len(forwarded) - 1
        return chat_answer(f"edit v{k} to v{k + 1}\n")  # aider echoes it back stripped

    app = create_app(ServerConfig(upstream="http://upstream/v1", store=str(path), policy="learned", budget=3000, calibrate=False))
    app.state.proxy.transport = httpx.MockTransport(upstream)

    async def chat() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            return [await c.post("/v1/chat/completions", json={"model": "m", "messages": aider_request(k)}) for k in range(24)]

    responses = asyncio.run(chat())
    store = app.state.proxy.store
    for k, r in enumerate(responses):
        sent = aider_request(k)
        assert r.status_code == 200 and r.headers["x-historygraph-context"] == "client-curated"
        assert forwarded[k] == sent  # forwarded as aider sent it
        # the session of each request reads back exactly what was sent (with the time it arrived), then the answer
        assert [replace(m, timestamp=None) for m in store.messages(r.headers["x-historygraph-session"])] == [Message.from_openai(m) for m in sent] + [
            Message("assistant", f"edit v{k} to v{k + 1}\n")]
    sessions = [r.headers["x-historygraph-session"] for r in responses]
    root = sessions[0]
    assert sessions[1:] == [f"{root}~{k}" for k in range(1, 24)]  # one chat: the root and a branch per later request
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 147
        assert db.execute("SELECT count(*) FROM events WHERE session_id = ?", (sessions[-1],)).fetchone()[0] == 6
    db.close()
    assert [i.shared for i in store.session_infos()] == [0, 5] + [5 + 2 * k for k in range(1, 23)]


def test_three_sessions_started_at_once_each_store_their_answer_in_a_valid_session():
    """Three Claude Code sessions started together send the same first request; all three are
    in flight before the first answer comes. Each answer calls a tool: stored in the one session
    the three requests matched, they made it [system, user, assistant(call 1), assistant(call 2),
    assistant(call 3)], calls with no results between them. Now the first answer goes to the
    session, each other one to a branch holding the request and that answer; each client's next
    request (its tool's result) continues its own."""
    arrived: list[int] = []
    together = asyncio.Event()

    async def upstream(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        n = len(body["messages"])
        if n == 1:  # the first request: answered once all three are in flight
            arrived.append(1)
            if len(arrived) == 3:
                together.set()
            await together.wait()
            await asyncio.sleep(0.01 * len(arrived))
            arrived.pop()
            call = f"toolu_{len(arrived) + 1}"
            content = [{"type": "tool_use", "id": call, "name": "Bash", "input": {"command": "ls"}}]
        else:
            content = [{"type": "text", "text": "done"}]
        return httpx.Response(200, json={"id": "msg", "type": "message", "role": "assistant", "model": "m", "content": content,
                                         "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 5}})

    app = create_app(ServerConfig(anthropic_upstream="http://upstream", store=":memory:", policy="learned", budget=3000,
                                  calibrate=False))
    app.state.proxy.transport = httpx.MockTransport(upstream)
    first = {"model": "m", "max_tokens": 100, "system": "You are Claude Code.", "messages": [{"role": "user", "content": "hi"}]}

    async def three() -> list[tuple[httpx.Response, httpx.Response]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            async def client() -> tuple[httpx.Response, httpx.Response]:
                r = await c.post("/v1/messages", json=first)
                use = r.json()["content"][0]
                nxt = {**first, "messages": [*first["messages"], {"role": "assistant", "content": [use]},
                                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                                          "content": "a.txt"}]}]}
                return r, await c.post("/v1/messages", json=nxt)
            return await asyncio.gather(client(), client(), client())

    pairs = asyncio.run(three())
    store = app.state.proxy.store
    calls = sorted(first.json()["content"][0]["id"] for first, _ in pairs)
    assert calls == ["toolu_1", "toolu_2", "toolu_3"]
    for s in store.sessions():  # every stored session is valid: each call directly followed by its result
        msgs = store.messages(s)
        for p, m in enumerate(msgs[:-1]):
            if m.tool_calls:
                assert [r.tool_call_id for r in msgs[p + 1:p + 1 + len(m.tool_calls)]] == [c.id for c in m.tool_calls], (s, msgs)
    root = pairs[0][0].headers["x-historygraph-session"].split("~")[0]
    assert sorted(store.sessions()) == [root, root + "~1", root + "~2"]
    for first, second in pairs:  # each client's tool result continued the session holding its call
        sid = second.headers["x-historygraph-session"]
        call = first.json()["content"][0]["id"]
        assert [(m.role, [c.id for c in m.tool_calls], m.tool_call_id) for m in store.messages(sid)] == [
            ("system", [], None), ("user", [], None), ("assistant", [call], None), ("tool", [], call), ("assistant", [], None)]
    assert {i.shared for i in store.session_infos() if i.id != root} == {2}  # the branches share the request with the root
