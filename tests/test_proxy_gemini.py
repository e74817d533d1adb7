"""The proxy's Gemini API (issue 50, item 1): the wire conversion (providers/gemini.py), Google's
token estimates for inline data, and the endpoints end to end: a Gemini-CLI-like client runs a
tool loop through the proxy (in-process) at a small B in front of the rule-enforcing fake
provider (tests/fake_gemini.py, a process of its own), streamed and not."""

from __future__ import annotations

import asyncio
import base64
import json
import re

import httpx
import pytest

from historygraph import Message, TokenCounter
from historygraph.history.events import EventError, ToolCall
from historygraph.providers import gemini as gem
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.signals.media import gemini_image_tokens, media_tokens
from historygraph.store.memory import MemoryStore

from fake_gemini import signature

counter = TokenCounter()
SYSTEM = {"parts": [{"text": "You are a coding agent."}]}


def user(text: str) -> dict:
    return {"role": "user", "parts": [{"text": text}]}


def test_a_tool_loop_converts_to_paired_canonical_messages():
    call_a = {"name": "ls", "args": {"dir": "."}}
    contents = [user("list it"),
                {"role": "model", "parts": [{"text": "Let me "}, {"text": "look."},
                                            {"functionCall": call_a, "thoughtSignature": "c2ln"},
                                            {"functionCall": {"name": "cat", "args": {}, "id": "own-7"}}]},
                # answered in the other order: paired by id, else by name
                {"role": "user", "parts": [{"functionResponse": {"name": "cat", "id": "own-7", "response": {"output": "x = 1"}}},
                                           {"functionResponse": {"name": "ls", "response": {"files": ["a", "b"]}}}]},
                {"parts": [{"text": "and now?"}]}]  # a role left out is the user's
    msgs, pieces = gem.to_canonical(SYSTEM, contents)
    assert msgs == [
        Message("system", "You are a coding agent."),
        Message("user", "list it"),
        # ids by place, whatever id the client gave a call (Gemini CLI gives each its own)
        Message("assistant", "Let me look.", (ToolCall("gemini-1-0", "ls", '{"dir": "."}'), ToolCall("gemini-1-1", "cat", "{}")),
                provider_blocks='[{"thoughtSignature":"c2ln"}]'),
        Message("tool", "x = 1", tool_call_id="gemini-1-1", name="cat"),
        Message("tool", '{"files": ["a", "b"]}', tool_call_id="gemini-1-0", name="ls"),
        Message("user", "and now?")]
    assert [p.turn if p else None for p in pieces] == [None, 0, 1, 2, 2, 3]
    # shown unchanged, every turn goes back as the client sent it (signatures byte for byte)
    assert gem.from_canonical(msgs, pieces) == [contents[0], contents[1],
                                                {"role": "user", "parts": contents[2]["parts"] + contents[3]["parts"]}]


def test_changed_messages_are_rebuilt_and_same_role_turns_merged():
    contents = [user("go"), {"role": "model", "parts": [{"functionCall": {"name": "run", "args": {"c": 1}},
                                                          "thoughtSignature": "c2ln"}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "run", "response": {"error": "boom " * 50}}}]},
                {"role": "model", "parts": [{"text": "done"}]}]
    msgs, pieces = gem.to_canonical(None, contents)
    shown = [msgs[0], msgs[1].with_content("[brief]", "brief"), msgs[2].with_content("[omitted gemini-1-0]", "placeholder"),
             Message("user", "[marker]", rendered_as="marker"), msgs[3]]
    out = gem.from_canonical(shown, [*pieces[:3], None, pieces[3]])
    assert out == [user("go"),
                   # the brief's text first, the call with its signature kept
                   {"role": "model", "parts": [{"text": "[brief]"}, contents[1]["parts"][0]]},
                   # an error stays an error; the marker joins the results' user turn
                   {"role": "user", "parts": [{"functionResponse": {"name": "run", "response": {"error": "[omitted gemini-1-0]"}}},
                                              {"text": "[marker]"}]},
                   contents[3]]


@pytest.mark.parametrize("contents, named", [
    ([user("a"), {"role": "model", "parts": []}], "contents[1].parts must be a non-empty list"),
    ([{"role": "assistant", "parts": [{"text": "a"}]}], "contents[0].role must be 'user' or 'model'"),
    ([user("a"), {"role": "model", "parts": [{"functionCall": {"name": "f"}}]}, user("b")],
     "contents[2] answers none of the functionCall parts of contents[1]"),
    ([user("a"), {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}],
     "contents[1].parts[0]: a functionResponse named 'f' answers no functionCall"),
    ([user("a"), {"role": "model", "parts": [{"functionCall": {"name": "f"}}, {"functionCall": {"name": "g"}}]},
      {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}],
     "contents[2] answers only some of the functionCall parts of contents[1] (no functionResponse for g)"),
    ([{"role": "user", "parts": [{"text": "a", "inlineData": {"mimeType": "image/png", "data": ""}}]}],
     "contents[0].parts[0] must hold exactly one of"),
    ([], "contents must be a non-empty list"),
    # the gate's finding: a function response's media parts unchecked, 5 raised TypeError (500) and
    # a malformed blob was stored and forwarded
    *[([user("a"), {"role": "model", "parts": [{"functionCall": {"name": "f"}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}, "parts": parts}}]}], named)
      for parts, named in [(5, "contents[2].parts[0].functionResponse.parts must be a list of parts, got int"),
                           ("x", "contents[2].parts[0].functionResponse.parts must be a list of parts, got str"),
                           ([{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}, "x"],
                            "contents[2].parts[0].functionResponse.parts[1] must be an object, got str"),
                           ([{"inlineData": "AAAA"}], "contents[2].parts[0].functionResponse.parts[0].inlineData must be an object"),
                           ([{"inlineData": {"mimeType": "image/png"}}],
                            "contents[2].parts[0].functionResponse.parts[0].inlineData must be an object")]],
])
def test_bad_contents_name_the_field(contents, named):
    with pytest.raises(EventError, match=re.escape(named)):
        gem.to_canonical(None, contents)


def test_a_streamed_answer_is_rebuilt_with_the_id_its_echo_gets():
    acc = gem.StreamAccumulator.for_turn(3)()
    for chunk in [{"candidates": [{"content": {"role": "model", "parts": [{"text": "I should", "thought": True}]}}]},
                  {"candidates": [{"content": {"role": "model", "parts": [{"text": " look", "thought": True}]}}]},
                  {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}]},
                  {"candidates": [{"content": {"role": "model", "parts": [{"text": "lo"}]}}]},
                  {"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]},
                                   "finishReason": "STOP"}],
                   "usageMetadata": {"promptTokenCount": 10, "cachedContentTokenCount": 4}}]:
        assert acc.message() is None
        acc.feed(chunk)
    # the thought summary left out of the answer stored (Gemini CLI does not send it back)
    assert acc.parts[0] == {"text": "I should look", "thought": True}
    assert acc.message() == Message("assistant", "Hello", (ToolCall("gemini-3-0", "f", '{"a": 1}'),))
    assert (acc.usage.fresh, acc.usage.cache_read, acc.usage.cache_write) == (6, 4, 0)
    # the client's echo of that answer, as contents[3] of its next request, is the same event,
    # with the id the client gave the call too
    echo = {"role": "model", "parts": [{"text": "Hello"}, {"functionCall": {"name": "f", "args": {"a": 1}, "id": "f_17_0"}}]}
    assert gem.to_canonical(None, [user("a"), user("b"), user("c"), echo])[0][3] == acc.message()
    # a blocked prompt: one chunk without candidates ends the stream, with no answer
    blocked = gem.StreamAccumulator.for_turn(1)()
    blocked.feed({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 5}})
    assert blocked.complete and blocked.message() is None


def png(width: int, height: int) -> str:
    """A PNG header of the given size (the estimate reads only the header), base64."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk).decode()


def test_inline_images_are_charged_by_googles_tile_rule():
    # Google: both sides <= 384 px: 258 tokens; else 768 x 768 tiles of 258 tokens each
    assert gemini_image_tokens((384, 384)) == 258
    assert gemini_image_tokens((385, 100)) == 258  # one tile
    assert gemini_image_tokens((1000, 800)) == 4 * 258  # 2 x 2 tiles
    part = {"inlineData": {"mimeType": "image/png", "data": png(1600, 700)}}
    msgs, _ = gem.to_canonical(None, [{"role": "user", "parts": [{"text": "see"}, part]}])
    assert msgs[0].content == "see\n[inlineData]"
    assert media_tokens(msgs[0].media, counter.count) == 3 * 258  # 3 x 1 tiles


# ---- through the proxy -------------------------------------------------------------------------

LONG = "line of tool output\n" * 50  # about 250 tokens: B = 600 holds two such results, not five
BUDGET = 600
TOOLS = [{"functionDeclarations": [{"name": "run", "description": "run it",
                                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]}]


def run_loop(fake: str, stream: bool, steps: int = 5, key_in_query: bool = False):
    """A client as Gemini CLI is: each answer's model turn is appended as received; each call is
    answered with a ~250-token result, a text answer by "go on", until ``steps`` calls were
    answered and the model answered their last one in text (the fake calls after the user's own
    turns and answers results in text: 2 × ``steps`` requests). Returns every answer's (status,
    json, headers), the forwarded requests, the fake's rejections, the store and the contents."""
    store = MemoryStore()
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    contents = [user("fix the bug")]

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune", budget=BUDGET, gemini_upstream=fake,
                                      calibrate=False), store=store)
        answers = []
        done = 0
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c, \
                httpx.AsyncClient(base_url=fake, timeout=30) as up:
            await up.post("/_reset")
            while True:
                url = f"/v1beta/models/gemini-2.5-flash:{method}" + (("&" if stream else "?") + "key=SECRET-KEY" if key_in_query else "")
                r = await c.post(url, json={"systemInstruction": SYSTEM, "contents": contents, "tools": TOOLS},
                                 headers={} if key_in_query else {"x-goog-api-key": "SECRET-KEY"})
                if stream:
                    chunks = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
                    parts = [p for ch in chunks for p in ch["candidates"][0]["content"]["parts"]]
                    body = chunks
                else:
                    body = r.json()
                    parts = body["candidates"][0]["content"]["parts"] if r.status_code == 200 else []
                answers.append((r.status_code, body, r.headers))
                calls = [p["functionCall"] for p in parts if "functionCall" in p]
                if r.status_code != 200 or (not calls and done == steps):
                    break
                if stream and not calls:  # the client joins the streamed text pieces into one part
                    parts = [{"text": "".join(p["text"] for p in parts)}]
                contents.append({"role": "model", "parts": parts})
                contents.append({"role": "user", "parts": [{"functionResponse": {"name": c["name"], "response": {"output": f"{done}: {LONG}"}}}
                                                           for c in calls] or [{"text": "go on"}]})
                done += bool(calls)
            seen = (await up.get("/_requests")).json()
            rejected = (await up.get("/_rejections")).json()
            sid = answers[-1][2].get("x-historygraph-session")
            first = (await c.get(f"/api/sessions/{sid}/results/gemini-1-0")).json()  # the first call's result, by its id
        await app.state.proxy.transport.aclose()
        return answers, seen, rejected, first

    answers, seen, rejected, first = asyncio.run(main())
    return answers, seen, rejected, store, contents, first


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_through_the_proxy_stays_within_b_and_is_accepted(fake, stream):
    answers, seen, rejected, store, contents, first = run_loop(fake, stream)
    assert rejected == []
    assert [s for s, _, _ in answers] == [200] * 10
    sessions = {h["x-historygraph-session"] for _, _, h in answers}
    assert len(sessions) == 1 and store.sessions() == list(sessions)  # one session: each answer's echo continues it
    sid = sessions.pop()
    # system, task, 5 x (call, result, text answer, "go on"; the last without), all stored
    stored = store.messages(sid)
    assert [m.role for m in stored] == ["system", "user", *["assistant", "tool", "assistant", "user"] * 4, "assistant", "tool", "assistant"]
    # each call's id: its model turn's index in contents (1, 5, 9 …), its echo's too
    assert [c.id for m in stored if m.role == "assistant" for c in m.tool_calls] == [f"gemini-{1 + 4 * k}-0" for k in range(5)]
    last = seen[-1]
    assert last["headers"]["x-goog-api-key"] == "SECRET-KEY" and "key=" not in last["path"]
    sent = last["body"]["contents"]
    calls = [p["functionCall"]["name"] for t in sent for p in t["parts"] if "functionCall" in p]
    results = [p["functionResponse"]["response"]["output"] for t in sent for p in t["parts"] if "functionResponse" in p]
    assert len(calls) == len(results) >= 1  # every call shown is answered (the fake checks the turns)
    assert results[-1] == f"4: {LONG}"  # the newest result complete (§5.9)
    whole = [r for r in results if r.endswith(LONG)]
    for r in results:
        if r not in whole:
            assert "gemini-" in r and "omitted" in r and len(r) < 300  # a placeholder naming the call's id
    # the calls not shown are named by dropped-step markers ("tool calls: N")
    texts = [p["text"] for t in sent for p in t["parts"] if "text" in p]
    dropped = sum(int(m.group(1)) for t in texts for m in re.finditer(r"tool calls: (\d+)", t))
    assert len(calls) + dropped == 5
    assert int(answers[-1][2]["x-historygraph-omitted"]) == 5 - len(whole)
    assert first["content"] == f"0: {LONG}"  # what the rendering left out, restored whole by id
    assert "x-historygraph-over-budget" not in answers[-1][2]
    # what was sent fits B: every message but the system prompt and the latest user message
    # (outside B, docs/architecture.md) counted as the proxy's counter counts them
    msgs, _ = gem.to_canonical(last["body"]["systemInstruction"], sent)
    latest_user = max(i for i, m in enumerate(msgs) if m.role == "user")
    assert sum(counter.count_message(m) for i, m in enumerate(msgs) if m.role != "system" and i != latest_user) <= BUDGET
    # the model turns shown went out as the client sent them, signatures byte for byte
    for turn in sent:
        if turn["role"] == "model":
            assert turn in contents
            assert all(p["thoughtSignature"] == signature(p["functionCall"]) for p in turn["parts"] if "functionCall" in p)


@pytest.mark.slow
def test_a_key_in_the_query_passes_through_and_is_never_shown(fake):
    answers, seen, rejected, _, _, _ = run_loop(fake, stream=True, steps=1, key_in_query=True)
    assert [s for s, _, _ in answers] == [200, 200] and rejected == [] and len(seen) == 2
    assert all(r["query"] == "alt=sse&key=SECRET-KEY" for r in seen)
    # an upstream that does not answer: the 502 names the URL with the key masked
    r, _, _ = proxy_call(fake, "/v1beta/models/m:generateContent?key=SECRET-KEY", {"contents": [user("a")]},
                         upstream="http://127.0.0.1:9")
    assert r.status_code == 502 and r.json()["error"]["status"] == "UNAVAILABLE"
    assert "key=***" in r.json()["error"]["message"] and "SECRET" not in r.text


def proxy_call(fake: str, path: str, body: dict | bytes | None, method: str = "POST", sid: str = "bad-1",
               upstream: str | None = None):
    """One request through the proxy (to ``upstream``, else the fake; ``body`` JSON, or its bytes):
    its answer, what the fake received, the store."""
    store = MemoryStore()

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune", budget=BUDGET, gemini_upstream=upstream or fake,
                                      calibrate=False), store=store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c, \
                httpx.AsyncClient(base_url=fake, timeout=30) as up:
            await up.post("/_reset")
            sent = {"content": body} if isinstance(body, bytes) else {"json": body}
            r = await c.request(method, path, **sent, headers={"X-HistoryGraph-Session": sid})
            seen = (await up.get("/_requests")).json()
        await app.state.proxy.transport.aclose()
        return r, seen

    r, seen = asyncio.run(main())
    return r, seen, store


@pytest.mark.slow
@pytest.mark.parametrize("body, named", [
    ({"contents": [user("a"), {"role": "model", "parts": []}]}, "contents[1].parts must be a non-empty list"),
    ({"contents": [user("a"), {"role": "model", "parts": [{"functionCall": {"name": "f"}}]}, user("b")]},
     "answers none of the functionCall parts of contents[1]"),
    ({"contents": "hello"}, "contents: required, a list"),
    ({"systemInstruction": "be brief", "contents": [user("a")]}, "systemInstruction must be a Content object"),
    ({"contents": [{"role": "user", "parts": [{"text": 5}]}]}, "contents[0].parts[0].text must be a string"),
    ({"contents": [user("a"), {"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]},
     "contents[1].parts[0].functionCall.args must be an object"),
    ({"contents": [{"role": "user", "parts": [{"inlineData": {"data": "AAAA"}}]}]}, "contents[0].parts[0].inlineData must be an object"),
    (b'{"contents": [{"role": "user", "parts": [{"text": "a\\ud800"}]}]}', "lone UTF-16 surrogate"),
    ({"contents": [user("a"), {"role": "model", "parts": [{"functionCall": {"name": "f"}}]},  # was a 500 (TypeError)
                   {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}, "parts": 5}}]}]},
     "contents[2].parts[0].functionResponse.parts must be a list of parts"),
])
def test_bad_input_is_a_400_in_googles_shape_and_nothing_is_stored(fake, body, named):
    r, seen, store = proxy_call(fake, "/v1beta/models/gemini-2.5-flash:generateContent", body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert set(error) == {"code", "message", "status"} and (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert named in error["message"]
    assert seen == [] and store.sessions() == []


@pytest.mark.slow
def test_unknown_routes_and_methods_answer_googles_404(fake):
    for method, path in [("POST", "/v1beta/models/gemini-2.5-flash:embedContent"), ("POST", "/v1beta/cachedContents"),
                         ("DELETE", "/v1beta/models")]:
        r, _, _ = proxy_call(fake, path, {"contents": [user("a")]}, method)
        assert r.status_code == 404, (method, path)
        assert r.json()["error"]["status"] == "NOT_FOUND" and path in r.json()["error"]["message"]
    r, seen, _ = proxy_call(fake, "/v1beta/models", None, "GET")
    assert r.status_code == 200 and r.json()["models"][0]["name"] == "models/fake-gemini" and seen == []


@pytest.mark.slow
def test_count_tokens_counts_what_would_be_forwarded(fake):
    # "hello" is 1 token of o200k_base; +3 per message and 3 for the reply (docs/proxy.md)
    r, seen, store = proxy_call(fake, "/v1beta/models/gemini-2.5-flash:countTokens", {"contents": [user("hello")]})
    assert r.json() == {"totalTokens": 1 + 3 + 3} and seen == [] and store.sessions() == []
    r, _, _ = proxy_call(fake, "/v1beta/models/gemini-2.5-flash:countTokens",
                         {"generateContentRequest": {"model": "models/x", "contents": [user("hello")]}})
    assert r.json() == {"totalTokens": 7}


@pytest.mark.slow
def test_upstream_errors_and_cut_streams_reach_the_client_in_googles_shape(fake):
    store = MemoryStore()
    thinking = {"generationConfig": {"thinkingConfig": {"includeThoughts": True}}}  # three events: cut after two

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune", budget=BUDGET, gemini_upstream=fake,
                                      calibrate=False), store=store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c:
            limited = await c.post("/v1beta/models/error-model:generateContent", json={"contents": [user("a")]},
                                   headers={"X-HistoryGraph-Session": "g-429"})
            cut = await c.post("/v1beta/models/cut-model:streamGenerateContent?alt=sse",
                               json={"contents": [user("b")], **thinking}, headers={"X-HistoryGraph-Session": "g-cut"})
            metrics = (await c.get("/metrics")).text
        await app.state.proxy.transport.aclose()
        return limited, cut, metrics

    limited, cut, metrics = asyncio.run(main())
    # the upstream's own error, unchanged; the request stored, no answer
    assert limited.status_code == 429 and limited.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert [m.role for m in store.messages("g-429")] == ["user"]
    # a stream cut before its finishReason ends with Google's error as the last event; no answer stored
    last = json.loads([line for line in cut.text.splitlines() if line.startswith("data:")][-1][5:])
    assert last["error"]["code"] == 502 and last["error"]["status"] == "UNAVAILABLE" and "cut" in last["error"]["message"]
    assert [m.role for m in store.messages("g-cut")] == ["user"]
    assert 'historygraph_requests_total{api="gemini",status="429"} 1.0' in metrics
    assert 'historygraph_upstream_errors_total{api="gemini",kind="stream_cut"} 1.0' in metrics
