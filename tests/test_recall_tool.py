"""The proxy's recall tool, end to end in-process: the official openai and anthropic clients (async,
over httpx's ASGI transport) → the proxy → a scripted upstream that calls the recall tool when it
sees a placeholder. Both APIs, streamed and not; the client never sees the tool."""

from __future__ import annotations

import asyncio
import json
import re

# the official clients (openai, anthropic) are imported in the functions that use them: every test
# process collects this file, and importing both costs about 2 CPU s (docs/tests.md)
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from prometheus_client.parser import text_string_to_metric_families

from historygraph import MemoryStore
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.server.recall_tool import TOOL_NAME

BIG, SMALL = "big line\n" * 200, "small line\n" * 150
PLACEHOLDER = re.compile(r"\[tool result (\S+) omitted from this context")


def scripted_upstream(seen: list[dict], always_recall: bool = False) -> FastAPI:
    """Calls the recall tool (ids from the placeholders) while it is offered and no recalled result
    is in the conversation; then answers 'saw: ' + the first 8 characters of the latest tool result."""
    up = FastAPI()

    def decide(texts: list[str], tools: list[str], results: list[str]) -> tuple[str, list[str]] | None:
        ids = [i for t in texts for i in PLACEHOLDER.findall(t)]
        if TOOL_NAME in tools and ids and (always_recall or not any(r.startswith("big line") for r in results)):
            return "recall", ids
        return None

    def sse(events: list) -> StreamingResponse:
        openai_form = "choices" in events[0]
        body = "".join(("" if openai_form else f"event: {e['type']}\n") + f"data: {json.dumps(e)}\n\n" for e in events)
        return StreamingResponse(iter([body.encode(), b"data: [DONE]\n\n"] if openai_form else [body.encode()]),
                                 media_type="text/event-stream")

    @up.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append(body)
        msgs = body["messages"]
        tools = [t["function"]["name"] for t in body.get("tools") or []]
        results = [m["content"] for m in msgs if m["role"] == "tool"]
        d = decide([m.get("content") or "" for m in msgs], tools, results)
        n = len(seen)
        if d:
            call = {"id": f"rc_{n}", "type": "function", "function": {"name": TOOL_NAME, "arguments": json.dumps({"ids": d[1]})}}
            msg, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        else:
            msg, finish = {"role": "assistant", "content": "saw: " + results[-1][:8]}, "stop"
        if not body.get("stream"):
            return {"id": f"c{n}", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}
        base = {"id": f"c{n}", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        if d:
            delta = {"role": "assistant", "tool_calls": [{"index": 0, **msg["tool_calls"][0]}]}
            events = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}]
        else:
            text = msg["content"]
            events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text[:4]}, "finish_reason": None}]},
                      {**base, "choices": [{"index": 0, "delta": {"content": text[4:]}, "finish_reason": None}]}]
        events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        return sse(events)

    @up.post("/v1/messages")
    async def messages(request: Request):
        body = await request.json()
        seen.append(body)
        tools = [t["name"] for t in body.get("tools") or []]
        texts, results = [], []
        for turn in body["messages"]:
            for b in turn["content"] if isinstance(turn["content"], list) else [{"type": "text", "text": turn["content"]}]:
                if b["type"] == "tool_result":
                    c = b["content"] if isinstance(b["content"], str) else "".join(x.get("text", "") for x in b["content"])
                    texts.append(c)
                    results.append(c)
                elif b["type"] == "text":
                    texts.append(b["text"])
        d = decide(texts, tools, results)
        n = len(seen)
        thinking = {"type": "thinking", "thinking": f"round {n}", "signature": f"sig{n}"}
        blocks = [thinking, {"type": "tool_use", "id": f"toolu_{n}", "name": TOOL_NAME, "input": {"ids": d[1]}}] if d else \
            [thinking, {"type": "text", "text": "saw: " + results[-1][:8]}]
        stop = "tool_use" if d else "end_turn"
        msg = {"id": f"m{n}", "type": "message", "role": "assistant", "model": body["model"], "content": blocks,
               "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}
        if not body.get("stream"):
            return msg
        events = [{"type": "message_start", "message": {**msg, "content": [], "stop_reason": None}}]
        for i, b in enumerate(blocks):
            if b["type"] == "thinking":
                events += [{"type": "content_block_start", "index": i, "content_block": {"type": "thinking", "thinking": ""}},
                           {"type": "content_block_delta", "index": i, "delta": {"type": "thinking_delta", "thinking": b["thinking"]}},
                           {"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": b["signature"]}}]
            elif b["type"] == "tool_use":
                events += [{"type": "content_block_start", "index": i, "content_block": {**b, "input": {}}},
                           {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}}]
            else:
                events += [{"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                           {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": b["text"]}}]
            events.append({"type": "content_block_stop", "index": i})
        events += [{"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 1}},
                   {"type": "message_stop"}]
        return sse(events)

    return up


def proxy(recall: bool = True, always_recall: bool = False, rounds: int = 3):
    seen: list[dict] = []
    store = MemoryStore()
    app = create_app(ServerConfig(upstream="http://upstream/v1", anthropic_upstream="http://upstream", store=":memory:",
                                  policy="prune", budget=700, recall=recall, recall_rounds=rounds), store=store)
    app.state.proxy.transport = httpx.ASGITransport(app=scripted_upstream(seen, always_recall))
    return app, seen, store


def transport(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")


READ = {"type": "function", "function": {"name": "read", "description": "read a file",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
HISTORY = [
    {"role": "user", "content": "Read big.txt and small.txt, then tell me the first word of big.txt."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "big.txt"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": BIG},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "read", "arguments": '{"path": "small.txt"}'}}]},
    {"role": "tool", "tool_call_id": "c2", "content": SMALL},
    {"role": "user", "content": "Well?"},
]


async def openai_answer(app, stream: bool, session: str = "r-1", **headers) -> tuple[str, list]:
    import openai

    client = openai.AsyncOpenAI(base_url="http://proxy/v1", api_key="sk-test", http_client=transport(app),
                                default_headers={"X-HistoryGraph-Session": session, **headers}, max_retries=0)
    if not stream:
        r = await client.chat.completions.create(model="m", messages=HISTORY, tools=[READ])
        return r.choices[0].message.content, r.choices[0].message.tool_calls or []
    text, calls = "", []
    async for chunk in await client.chat.completions.create(model="m", messages=HISTORY, tools=[READ], stream=True):
        delta = chunk.choices[0].delta
        text += delta.content or ""
        calls += delta.tool_calls or []
    return text, calls


def test_openai_model_recalls_an_omitted_result_and_the_client_sees_only_the_answer():
    for stream in (False, True):
        app, seen, store = proxy()
        text, calls = asyncio.run(openai_answer(app, stream))
        assert (text, calls) == ("saw: big line", [])
        assert len(seen) == 2
        first, second = seen
        assert [t["function"]["name"] for t in first["tools"]] == ["read", TOOL_NAME]
        assert PLACEHOLDER.search(first["messages"][2]["content"]).group(1) == "c1"  # B = 700: c1 omitted
        recall_turn, recalled = second["messages"][-2:]
        assert recall_turn["tool_calls"][0]["function"]["name"] == TOOL_NAME
        assert recalled["role"] == "tool" and recalled["content"] == BIG  # the complete stored result
        # only the client's conversation and the final answer are stored
        assert [m.content for m in store.messages("r-1")][-1] == "saw: big line" and len(store.messages("r-1")) == 7
        metrics = {(s.name, tuple(s.labels.items())): s.value for f in text_string_to_metric_families(
            app.state.proxy.metrics.exposition()[0].decode()) for s in f.samples}
        assert metrics[("historygraph_recall_calls_total", (("api", "openai"),))] == 1


async def anthropic_answer(app, stream: bool) -> tuple[str, list]:
    import anthropic

    import httpx2  # the anthropic SDK's HTTP client package

    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://proxy")
    client = anthropic.AsyncAnthropic(base_url="http://proxy", api_key="sk-ant-test", http_client=http,
                                      default_headers={"X-HistoryGraph-Session": "a-1"}, max_retries=0)
    turns = [
        {"role": "user", "content": "Read big.txt and small.txt, then tell me the first word of big.txt."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "big.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": BIG}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "read", "input": {"path": "small.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": SMALL}]},
        {"role": "user", "content": "Well?"},
    ]
    tools = [{"name": "read", "description": "read a file", "input_schema": {"type": "object", "properties": {}}}]
    if not stream:
        r = await client.messages.create(model="claude", max_tokens=50, messages=turns, tools=tools)
    else:
        async with client.messages.stream(model="claude", max_tokens=50, messages=turns, tools=tools) as s:
            r = await s.get_final_message()
    return "".join(b.text for b in r.content if b.type == "text"), [b for b in r.content if b.type == "tool_use"]


def test_anthropic_model_recalls_with_thinking_passed_back_streamed_and_not():
    for stream in (False, True):
        app, seen, store = proxy()
        text, calls = asyncio.run(anthropic_answer(app, stream))
        assert (text, calls) == ("saw: big line", [])
        assert len(seen) == 2 and [t["name"] for t in seen[0]["tools"]] == ["read", TOOL_NAME]
        turn, results = seen[1]["messages"][-2:]
        # the model's turn goes back whole: its thinking block with the signature, then the call
        assert turn["content"][0] == {"type": "thinking", "thinking": "round 1", "signature": "sig1"}
        assert turn["content"][1]["name"] == TOOL_NAME and turn["content"][1]["input"] == {"ids": ["t1"]}
        assert results["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": BIG}]
        assert store.messages("a-1")[-1].content == "saw: big line"


def test_recall_is_opt_in_and_offered_only_when_something_was_omitted():
    app, seen, _ = proxy(recall=False)
    asyncio.run(openai_answer(app, False))
    assert [t["function"]["name"] for t in seen[0]["tools"]] == ["read"] and len(seen) == 1
    app, seen, _ = proxy(recall=False)
    text, _ = asyncio.run(openai_answer(app, False, **{"X-HistoryGraph-Recall": "on"}))  # per request
    assert text == "saw: big line" and len(seen) == 2
    app, seen, _ = proxy(recall=True)
    asyncio.run(openai_answer(app, False, **{"X-HistoryGraph-Recall": "off"}))
    assert len(seen) == 1 and [t["function"]["name"] for t in seen[0]["tools"]] == ["read"]
    app, seen, _ = proxy(recall=True)
    asyncio.run(openai_answer(app, False, **{"X-HistoryGraph-Budget": "100000"}))  # everything fits: no tool
    assert [t["function"]["name"] for t in seen[0]["tools"]] == ["read"]


def test_rounds_are_bounded_and_the_last_call_has_no_recall_tool():
    app, seen, _ = proxy(always_recall=True, rounds=2)
    text, calls = asyncio.run(openai_answer(app, False))
    assert len(seen) == 3 and calls == []
    assert [t["function"]["name"] for t in seen[2]["tools"]] == ["read"]
    assert text == "saw: big line"


def test_unknown_ids_and_bad_arguments_are_answered_not_raised():
    from historygraph.server.recall_tool import recalled_text

    app, _, store = proxy()
    asyncio.run(openai_answer(app, False))
    px = app.state.proxy
    assert recalled_text(px, "r-1", '{"ids": ["nope"]}') == "[no tool result with id 'nope' in session 'r-1']"
    n = len(store.graph("r-1"))
    assert recalled_text(px, "r-1", f'{{"ids": ["#{n}"]}}') == f"[messages '#{n}': session 'r-1' holds messages #0–#{n - 1}]"
    assert recalled_text(px, "r-1", "not json").startswith(f'[{TOOL_NAME}: pass {{"ids"')
    assert recalled_text(px, "r-1", '{"ids": ["c2", "c1"]}') == f"tool result c2:\n{SMALL}\n\ntool result c1:\n{BIG}"
    # a span a dropped-step marker names: the stored messages, each headed by its number and role
    g = store.graph("r-1")
    p = g.result_of["c1"]
    assert recalled_text(px, "r-1", f'{{"ids": ["#{p}–#{p}"]}}') == f"message #{p} (tool, tool result c1):\n{BIG}"


def held_upstream(release: asyncio.Event, log: list[str]):
    """Chat Completions upstream (httpx MockTransport, whose streams reach the proxy as they are
    made): the first request calls the recall tool for the omitted ``c1``; the second answers in a
    stream that sends its first text and then holds until ``release`` is set (at most 5 s)."""
    seen: list[dict] = []

    class Held(httpx.AsyncByteStream):
        def __init__(self, parts):
            self.parts = parts

        async def __aiter__(self):
            for p in self.parts:
                if p is None:
                    log.append("upstream holds")
                    try:
                        await asyncio.wait_for(release.wait(), 5)
                    except asyncio.TimeoutError:
                        log.append("upstream gave up waiting")
                    continue
                yield p
            log.append("upstream finished")

    def chunk(delta, finish=None):
        return ("data: " + json.dumps({"id": "s", "object": "chat.completion.chunk", "created": 0, "model": "m",
                                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n").encode()

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if len(seen) == 1:
            call = {"index": 0, "id": "rc1", "type": "function", "function": {"name": TOOL_NAME, "arguments": '{"ids": ["c1"]}'}}
            parts = [chunk({"role": "assistant", "tool_calls": [call]}), chunk({}, "tool_calls"), b"data: [DONE]\n\n"]
        else:
            parts = [chunk({"role": "assistant", "content": "saw: "}), None, chunk({"content": body["messages"][-1]["content"][:8]}),
                     chunk({}, "stop"), b"data: [DONE]\n\n"]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Held(parts))

    return handler, seen


async def asgi_post(app, path: str, body: dict, headers: dict, on_body) -> list[bytes]:
    """POST through the raw ASGI interface (httpx's ASGITransport would wait for the whole body);
    ``on_body(chunk)`` is called as each response body chunk is sent."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("proxy", 80),
             "headers": [(k.lower().encode(), v.encode()) for k, v in {"content-type": "application/json", **headers}.items()]}
    sent = iter([{"type": "http.request", "body": raw, "more_body": False}])
    chunks: list[bytes] = []

    async def receive():
        return next(sent, None) or await asyncio.sleep(3600)

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            chunks.append(message["body"])
            on_body(message["body"])

    await app(scope, receive, send)
    return chunks


def test_a_streamed_answer_after_a_recall_round_reaches_the_client_while_the_upstream_still_streams():
    """--recall with ``stream: true``: the recall round is answered before the client sees anything,
    then the final round is relayed event by event: the client has the answer's first text while
    the upstream holds its stream open (before issue 36.6 the proxy read each round whole, so the
    first chunk came only after the upstream finished)."""
    log: list[str] = []

    async def go():
        release = asyncio.Event()
        handler, seen = held_upstream(release, log)
        app = create_app(ServerConfig(upstream="http://upstream/v1", store=":memory:", policy="prune", budget=700, recall=True))
        app.state.proxy.transport = httpx.MockTransport(handler)

        def on_body(chunk: bytes) -> None:
            if b"saw: " in chunk and not release.is_set():
                log.append("client has the first text")
                release.set()

        chunks = await asgi_post(app, "/v1/chat/completions", {"model": "m", "messages": HISTORY, "tools": [READ], "stream": True},
                                 {"X-HistoryGraph-Session": "held"}, on_body)
        return chunks, seen, app.state.proxy.store

    chunks, seen, store = asyncio.run(go())
    # round 1 read whole; round 2: the client has its first text before the upstream sends the rest
    assert log == ["upstream finished", "client has the first text", "upstream holds", "upstream finished"], log
    assert len(seen) == 2 and seen[1]["messages"][-1] == {"role": "tool", "tool_call_id": "rc1", "content": BIG}
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for c in chunks for line in c.decode().splitlines() if line.startswith("data: {"))
    assert text == "saw: big line" and TOOL_NAME not in b"".join(chunks).decode()
    assert store.messages("held")[-1].content == "saw: big line"
