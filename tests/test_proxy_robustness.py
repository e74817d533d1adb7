"""Never a bare 500 (issue 38, the proxy's classes 2, 3, 5, 7 and 8): malformed JSON that parses,
upstream faults, session ids, credentials in the upstream URL, and answers a client echoes back
slightly differently. Each gets a clear answer and leaves the session usable, on SQLite and on
PostgreSQL (``HISTORYGRAPH_TEST_POSTGRES``).

The proxy runs in-process (its app over ``httpx.ASGITransport``, which would raise what used to
drop a client's connection) in front of the fake provider process (tests/fake_upstream.py, whose
model names select the faults) or, where an answer of a given shape is needed, an
``httpx.MockTransport``."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig

from test_server import A_TOOLS, FAKE, TOOLS, _port
from test_store import pg_dsn  # noqa: F401  (a fresh PostgreSQL schema)

APIS = {  # path, how a message list is sent, the error shape's message
    "openai": ("/v1/chat/completions", "messages", lambda e: e["error"]["message"]),
    "anthropic": ("/v1/messages", "messages", lambda e: e["error"]["message"] if e.get("type") == "error" else None),
    "responses": ("/v1/responses", "input", lambda e: e["error"]["message"]),
}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "postgres":
        return request.getfixturevalue("pg_dsn")
    return str(tmp_path / "robust.sqlite")


def run(store: str, upstream: str | None, scenario, transport: httpx.AsyncBaseTransport | None = None, **config):
    """``scenario(client, app)`` against the proxy app over ``store`` in front of ``upstream``."""
    async def main():
        up = upstream or "http://upstream.invalid"
        app = create_app(ServerConfig(store=store, policy="prune", upstream=up + "/v1", anthropic_upstream=up, **config))
        if transport is not None:
            app.state.proxy.transport = transport
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c:
                return await scenario(c, app)
        finally:
            await app.state.proxy.transport.aclose()
            app.state.proxy.store.close()
    return asyncio.run(main())


def body_of(api: str, model: str = "m", **extra) -> dict:
    path, field, _ = APIS[api]
    messages = "hi" if api == "responses" else [{"role": "user", "content": "hi"}]
    return {"model": model, field: messages, **({"max_tokens": 20} if api == "anthropic" else {}), **extra}


# -- class 2: malformed JSON that parses ------------------------------------------------------------

DEEP = "[" * 3000 + "]" * 3000  # 6 KB
MALFORMED = {  # name: (raw body with {F} for the messages field, the field the answer must name)
    "deep nesting": ('{"model":"m","max_tokens":20,"{F}":[{"role":"user","content":%s}]}' % DEEP, "nested too deeply"),
    "lone surrogate": ('{"model":"m","max_tokens":20,"{F}":[{"role":"user","content":"a\\ud800b"}]}', "{F}[0].content"),
    "NaN": ('{"model":"m","max_tokens":20,"temperature":NaN,"{F}":[{"role":"user","content":"hi"}]}', "temperature"),
    "1e400 in a message": ('{"model":"m","max_tokens":20,"{F}":[{"role":"user","content":"hi","n":1e400}]}', "n"),
}


def test_json_that_parses_but_no_provider_reads_is_a_400_naming_the_field_and_stores_nothing(store_url):
    """Issue 38, class 2: each used to be a 500, two of them after storing the messages."""
    seen: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(500)

    async def scenario(c, app):
        for api, (path, field, message_of) in APIS.items():
            for name, (raw, where) in MALFORMED.items():
                sid = f"malformed-{api}-{name}".replace(" ", "-")
                r = await c.post(path, content=raw.replace("{F}", field).encode(), headers={
                    "X-HistoryGraph-Session": sid, "content-type": "application/json"})
                assert r.status_code == 400, (api, name, r.text)
                message = message_of(r.json())
                assert message and where.replace("{F}", field) in message, (api, name, message)
                if api != "anthropic":
                    assert r.json()["error"]["type"] == "invalid_request_error"
                assert not app.state.proxy.store.has_session(sid), (api, name)  # nothing stored
        assert seen == []  # nothing forwarded

    run(store_url, None, scenario, httpx.MockTransport(upstream))


def test_the_session_api_refuses_json_no_provider_reads_with_a_400_and_creates_no_session(store_url):
    """Issue 50: a lone surrogate in an append made the store's write raise UnicodeEncodeError (500)
    after the session had been created, empty; the proxy's endpoints already answered 400."""
    bodies = {  # sid: (raw body, what the answer must name)
        "sur3": ('{"messages":[{"role":"user","content":"a\\ud800b"}],"create":true}', "messages[0].content: a string holding a lone UTF-16 surrogate"),
        "nan": ('{"messages":[{"role":"user","content":"hi","n":NaN}],"create":true}', "messages[0].n: a number JSON cannot carry"),
        "big": ('{"messages":[{"role":"user","content":"hi","n":1e400}],"create":true}', "messages[0].n: a number JSON cannot carry"),
    }

    async def scenario(c, app):
        for sid, (raw, where) in bodies.items():
            r = await c.post(f"/api/sessions/{sid}/events", content=raw.encode(), headers={"content-type": "application/json"})
            assert r.status_code == 400 and where in r.json()["detail"], (sid, r.text)
            assert not app.state.proxy.store.has_session(sid), sid  # no empty session left behind
        ok = await c.post("/api/sessions/sur3/events", json={"messages": [{"role": "user", "content": "a\u2603b"}], "create": True})
        assert ok.status_code == 200 and [m.content for m in app.state.proxy.store.messages("sur3")] == ["a\u2603b"]

    run(store_url, None, scenario)


# -- class 3: upstream faults --------------------------------------------------------------------------

def test_upstream_faults_are_a_502_saying_what_the_upstream_did_and_the_session_stays_usable(store_url, fake):
    """Issue 38, class 3: a non-streamed body cut after its headers and a 200 whose body is not JSON
    (both 500s before), on each API; the next request of the session is answered."""
    async def scenario(c, app):
        for api, (path, _, message_of) in APIS.items():
            for model, said in [("truncated-model", "closed the connection before its body was complete"),
                                ("notjson-model", "its body is not a JSON object (text/html")]:
                sid = f"fault-{api}-{model}"
                headers = {"X-HistoryGraph-Session": sid}
                r = await c.post(path, json=body_of(api, model), headers=headers)
                assert r.status_code == 502, (api, model, r.text)
                message = message_of(r.json())
                assert message and said in message and "answered HTTP 200" in message, (api, model, message)
                assert (await c.post(path, json=body_of(api), headers=headers)).status_code == 200
                stored = app.state.proxy.store.messages(sid)
                assert [m.role for m in stored] == ["user", "assistant"] and "answer" in stored[-1].content

    run(store_url, fake, scenario)


def test_an_anthropic_stream_whose_tool_input_never_completes_ends_in_an_error_event(store_url, fake):
    """Issue 38, class 3: the stream's tool_use JSON never completes; the client's connection used
    to be dropped with no error event (here the app raised). Now the stream ends with Anthropic's
    own error event (which its SDK raises) saying what the upstream did; nothing is stored as the
    answer, and the session goes on."""
    async def scenario(c, app):
        headers = {"X-HistoryGraph-Session": "badtool"}
        payload = {"max_tokens": 20, "messages": [{"role": "user", "content": "find it"}], "tools": A_TOOLS}
        r = await c.post("/v1/messages", json={"model": "badtool-model", "stream": True, **payload}, headers=headers)
        assert r.status_code == 200
        events = [e for e in r.text.split("\n\n") if e.strip()]
        assert "message_stop" not in r.text and events[-1].startswith("event: error\ndata: ")
        error = json.loads(events[-1].split("data: ", 1)[1])
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
        assert "tool call whose input is not complete JSON" in error["error"]["message"]
        assert [m.role for m in app.state.proxy.store.messages("badtool")] == ["user"]
        r = await c.post("/v1/messages", json={"model": "m", **payload}, headers=headers)
        assert r.status_code == 200 and r.json()["content"][-1]["type"] == "tool_use"
        assert [m.role for m in app.state.proxy.store.messages("badtool")] == ["user", "assistant"]

    run(store_url, fake, scenario)


# -- class 5: session ids ----------------------------------------------------------------------------

def test_every_stored_session_id_is_readable_through_the_session_api_and_the_unstorable_are_refused(store_url, fake):
    """Issue 38, class 5: an id with "/" was stored and listed but 404 on read; a NUL in the path was
    a 500 on PostgreSQL."""
    ids = ["team/agent-1", "a/b/results/c", "with space %41", "x~y", "ünï/✓ 50%"]

    async def scenario(c, app):
        for sid in ids[:-1]:  # named by the proxy's header (ASCII)
            r = await c.post("/v1/chat/completions", json={**body_of("openai"), "tools": TOOLS},
                             headers={"X-HistoryGraph-Session": sid})
            assert r.status_code == 200 and r.headers["x-historygraph-session"] == sid
        r = await c.post(f"/api/sessions/{quote(ids[-1], safe='')}/events", json={"create": True, "messages": [
            {"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call/1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}]})
        assert r.status_code == 200
        listed = {s["id"] for s in (await c.get("/api/sessions")).json()}
        assert set(ids) <= listed
        for sid in ids:
            seg = quote(sid, safe="")
            detail = await c.get(f"/api/sessions/{seg}")
            assert detail.status_code == 200 and detail.json()["id"] == sid, (sid, detail.text)
            call = detail.json()["messages"][-1]["tool_calls"][0]["id"]
            assert (await c.post(f"/api/sessions/{seg}/render", json={})).status_code == 200
            assert (await c.post(f"/api/sessions/{seg}/events", json={"messages": [
                {"role": "tool", "tool_call_id": call, "content": "r"}]})).status_code == 200
            result = await c.get(f"/api/sessions/{seg}/results/{quote(call, safe='')}")
            assert result.status_code == 200 and result.json()["content"] == "r"
        # what cannot be stored: 400 naming the field; reading it: 404; never a 500
        r = await c.post("/api/sessions/a%00b/events", json={"messages": [{"role": "user", "content": "x"}], "create": True})
        assert r.status_code == 400 and "session_id" in r.json()["detail"] and "control characters" in r.json()["detail"]
        assert (await c.get("/api/sessions/a%00b")).status_code == 404
        r = await c.post("/v1/chat/completions", json=body_of("openai"), headers={"X-HistoryGraph-Session": "s" * 513})
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-HistoryGraph-Session"
        assert "at most 512 characters" in r.json()["error"]["message"]

    run(store_url, fake, scenario)


# -- class 7: credentials in --upstream ------------------------------------------------------------------

def test_credentials_in_the_upstream_url_never_reach_clients_or_the_log(tmp_path, caplog, monkeypatch):
    """Issue 38, class 7: ``https://user:pass@host/v1`` appeared in every 502 and in the log."""
    from historygraph.server.logs import redact

    closed = f"http://agent:s3cr3t-pw@127.0.0.1:{_port()}"  # nothing listens there

    async def scenario(c, app):
        texts = []
        for api, (path, _, message_of) in APIS.items():
            r = await c.post(path, json=body_of(api), headers={"X-HistoryGraph-Session": f"cred-{api}"})
            assert r.status_code == 502
            texts.append(message_of(r.json()))
        r = await c.get("/v1/models")
        assert r.status_code == 502
        return texts + [r.json()["error"]["message"]]

    with caplog.at_level(logging.DEBUG, logger="historygraph"):
        texts = run(str(tmp_path / "c.sqlite"), closed, scenario)
    for text in texts:
        assert "s3cr3t-pw" not in text and "agent" not in text and "***@127.0.0.1" in text, text
    assert "s3cr3t-pw" not in caplog.text
    assert redact("upstream https://agent:s3cr3t-pw@host/v1 failed") == "upstream https://[redacted]@host/v1 failed"
    # the start-up line of historygraph serve
    import uvicorn
    from typer.testing import CliRunner

    from historygraph.cli import app as cli

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    monkeypatch.setattr("historygraph.server.app.tune_gc", lambda: None)  # this test process's collector stays as it is
    res = CliRunner().invoke(cli, ["serve", "--upstream", closed + "/v1", "--anthropic-upstream", closed,
                                   "--store", ":memory:", "--log-level", "WARNING"])
    assert res.exit_code == 0 and "***@127.0.0.1" in res.output and "s3cr3t-pw" not in res.output


# -- class 8: an answer echoed back slightly differently ------------------------------------------------

ANTHROPIC_ANSWER = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
                    "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
                    "content": [{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
                                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
                                    {"type": "web_search_result", "url": "https://e.org", "title": "E",
                                     "encrypted_content": "enc", "page_age": None}]},
                                {"type": "text", "text": "found it", "citations": None},
                                {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "x", "n": None}}]}
OPENAI_ANSWER = {"id": "c", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
                 "message": {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
                     {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x", "k": 2}'}}]}}]}
RESPONSES_ANSWER = {"id": "resp_1", "object": "response", "status": "completed", "model": "m",
                    "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
                    "output": [{"type": "web_search_call", "id": "ws_1", "status": "completed",
                                "action": {"type": "search", "query": "q", "sources": None}},
                               {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                                "content": [{"type": "output_text", "text": "found it", "annotations": [], "logprobs": None}]}]}


def test_an_answer_echoed_back_without_its_null_fields_continues_the_session(store_url):
    """Issue 38, class 8: a client that echoes the answer with nested ``null`` fields dropped (as
    ``model_dump(exclude_none=True)`` does) or its tool arguments re-serialised forked the session
    into ``<id>~1`` on every request."""
    from anthropic.types import Message as AnthropicMessage

    def upstream(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        return httpx.Response(200, json=ANTHROPIC_ANSWER if path.endswith("/messages")
                              else RESPONSES_ANSWER if path.endswith("/responses") else OPENAI_ANSWER)

    def without_nulls(value):
        if isinstance(value, dict):
            return {k: without_nulls(v) for k, v in value.items() if v is not None}
        return [without_nulls(v) for v in value] if isinstance(value, list) else value

    async def scenario(c, app):
        # Anthropic: the official SDK's own echo of its parsed answer
        first = [{"role": "user", "content": "search"}]
        r = await c.post("/v1/messages", json={"model": "m", "max_tokens": 20, "messages": first, "tools": A_TOOLS},
                         headers={"X-HistoryGraph-Session": "echo-a"})
        echoed = AnthropicMessage.model_validate(r.json()).model_dump(exclude_none=True)["content"]
        assert echoed[1]["content"][0].get("page_age", "gone") == "gone"  # the SDK did drop the nested null
        turns = first + [{"role": "assistant", "content": echoed},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]}]
        # OpenAI: the tool call's arguments re-serialised (a framework parsed and re-dumped them)
        msgs = [{"role": "user", "content": "search"}]
        await c.post("/v1/chat/completions", json={"model": "m", "messages": msgs, "tools": TOOLS},
                     headers={"X-HistoryGraph-Session": "echo-o"})
        call = {**OPENAI_ANSWER["choices"][0]["message"]["tool_calls"][0]}
        call["function"] = {**call["function"], "arguments": json.dumps(json.loads(call["function"]["arguments"]),
                                                                        separators=(",", ":"))}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "r"}]
        # Responses: output items echoed without ids, statuses and nested nulls
        items = [{"role": "user", "content": "search"}]
        await c.post("/v1/responses", json={"model": "m", "input": items}, headers={"X-HistoryGraph-Session": "echo-r"})
        items += [without_nulls({k: v for k, v in it.items() if k not in ("id", "status")}) for it in RESPONSES_ANSWER["output"]]
        items.append({"role": "user", "content": "and?"})
        for path, payload, sid in [("/v1/messages", {"max_tokens": 20, "messages": turns, "tools": A_TOOLS}, "echo-a"),
                                   ("/v1/chat/completions", {"messages": msgs, "tools": TOOLS}, "echo-o"),
                                   ("/v1/responses", {"input": items}, "echo-r")]:
            r = await c.post(path, json={"model": "m", **payload}, headers={"X-HistoryGraph-Session": sid})
            assert r.status_code == 200 and r.headers["x-historygraph-session"] == sid, (path, r.text)
        assert not [s["id"] for s in (await c.get("/api/sessions")).json() if "~" in s["id"]]

    run(store_url, None, scenario, httpx.MockTransport(upstream))


def test_the_fake_provider_documents_its_fault_models():
    doc = Path(FAKE).read_text()
    for model in ("truncated-model", "notjson-model", "badtool-model"):
        assert model in doc
