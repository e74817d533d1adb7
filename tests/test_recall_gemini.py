"""The proxy's recall tool on the Gemini API (issue 50, item 1): a client sends a tool loop whose
first result the rendering omits (B = 700) through the proxy (in-process) to the rule-enforcing
fake provider (tests/fake_gemini.py, a process of its own), whose ``recall-…`` models call
``historygraph_recall`` with the placeholder's id; streamed and not. The client never sees the
recall round; the stored answer is the one it got, so its next request continues the session."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from historygraph.render.recall import USAGE
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.server.recall_tool import NOT_RUN
from historygraph.server import recall_gemini as rg
from historygraph.server.recall_gemini import DECLARATION
from historygraph.store.memory import MemoryStore

from fake_gemini import signature

BIG, SMALL = "big line\n" * 200, "small line\n" * 150
READ = {"functionDeclarations": [{"name": "read", "description": "read a file",
                                  "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]}


def user(text: str) -> dict:
    return {"role": "user", "parts": [{"text": text}]}


def call(path: str) -> dict:
    fc = {"name": "read", "args": {"path": path}}
    return {"role": "model", "parts": [{"functionCall": fc, "thoughtSignature": signature(fc)}]}


def result(text: str) -> dict:
    return {"role": "user", "parts": [{"functionResponse": {"name": "read", "response": {"output": text}}}]}


HISTORY = [user("Read big.txt and small.txt, then tell me the first word of big.txt."),
           call("big.txt"), result(BIG), call("small.txt"), result(SMALL), user("Well?")]


def ask(fake: str, model: str, stream: bool, recall: bool = True, thoughts: bool = False, sse: bool = True):
    """The request of :data:`HISTORY`, then the client's next one (its answer's turn appended, and
    a user turn, or the answers to its calls): the first answer's text and parts, the second's session, the fake's requests and
    rejections, the store and the proxy's /metrics text."""
    store = MemoryStore()
    method = ("streamGenerateContent" + ("?alt=sse" if sse else "")) if stream else "generateContent"

    async def post(c: httpx.AsyncClient, contents: list) -> tuple[httpx.Response, list]:
        body = {"contents": contents, "tools": [READ]}
        if thoughts:
            body["generationConfig"] = {"thinkingConfig": {"includeThoughts": True}}
        r = await c.post(f"/v1beta/models/{model}:{method}", json=body)
        assert r.status_code == 200, r.text
        chunks = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")] if stream else [r.json()]
        return r, [p for ch in chunks for p in ch["candidates"][0]["content"]["parts"]]

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune", budget=700, gemini_upstream=fake, calibrate=False,
                                      recall=recall), store=store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c, \
                httpx.AsyncClient(base_url=fake, timeout=30) as up:
            await up.post("/_reset")
            r, parts = await post(c, HISTORY)
            text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
            joined = [p for p in parts if not p.get("thought")] if not stream else [{"text": text}]
            calls = [p["functionCall"] for p in parts if "functionCall" in p]
            answers = {"role": "user", "parts": [{"functionResponse": {"name": f["name"], "response": {"output": "ok"}}} for f in calls]}
            r2, _ = await post(c, [*HISTORY, {"role": "model", "parts": joined}, answers if calls else user("Thanks.")])
            seen = [s["body"] for s in (await up.get("/_requests")).json()]
            rejected = (await up.get("/_rejections")).json()
            metrics = (await c.get("/metrics")).text
        await app.state.proxy.transport.aclose()
        sid = r.headers["x-historygraph-session"]
        assert r2.headers["x-historygraph-session"] == sid  # the stored answer is the one the client got
        return text, parts, seen, rejected, store.messages(sid), metrics

    return asyncio.run(main())


def declared(body: dict) -> list[str]:
    return [f["name"] for t in body.get("tools") or [] for f in t.get("functionDeclarations") or []]


@pytest.mark.parametrize("stream", [False, True])
def test_the_model_recalls_an_omitted_result_and_the_client_sees_only_the_answer(fake, stream):
    text, parts, seen, rejected, stored, metrics = ask(fake, "recall-model", stream)
    assert rejected == []
    assert text == f"recalled {len(BIG)}: big line" and not any("functionCall" in p for p in parts)
    first, second = seen[:2]
    assert declared(first) == ["read", "historygraph_recall"]
    assert first["tools"][0]["functionDeclarations"][1] == DECLARATION
    assert "[tool result gemini-1-0 omitted from this context" in first["contents"][2]["parts"][0]["functionResponse"]["response"]["output"]
    fc = {"name": "historygraph_recall", "args": {"ids": ["gemini-1-0"]}}
    # the model's turn goes back whole (its signature), answered by one functionResponse: the whole result
    assert second["contents"][-2:] == [{"role": "model", "parts": [{"functionCall": fc, "thoughtSignature": signature(fc)}]},
                                       {"role": "user", "parts": [{"functionResponse": {"name": "historygraph_recall",
                                                                                        "response": {"output": BIG}}}]}]
    assert len(seen) == 4  # two rounds per client request: the next one's rendering omits gemini-1-0 too
    # only the client's conversation and the answers it got are stored
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "tool", "user", "assistant", "user", "assistant"]
    assert stored[6].content == text and stored[6].tool_calls == ()
    assert 'historygraph_recall_calls_total{api="gemini"} 2.0' in metrics


def test_arguments_the_tool_does_not_take_are_answered_with_its_usage(fake):
    text, _, seen, rejected, _, _ = ask(fake, "recall-bad-model", stream=False)
    assert rejected == [] and text == f"recalled {len(USAGE)}: {USAGE[:8]}"
    assert seen[1]["contents"][-1]["parts"][0]["functionResponse"]["response"] == {"output": USAGE}


def test_the_clients_own_call_made_with_a_recall_is_answered_not_run_in_its_place(fake):
    text, parts, seen, rejected, _, _ = ask(fake, "recall-both-model", stream=False)
    assert rejected == [] and text == f"recalled {len(BIG)}: big line" and len(parts) == 1
    assert seen[1]["contents"][-1] == {"role": "user", "parts": [
        {"functionResponse": {"name": "read", "response": {"output": NOT_RUN.format(tool="historygraph_recall")}}},
        {"functionResponse": {"name": "historygraph_recall", "response": {"output": BIG}}}]}


def test_a_recall_after_the_answer_began_continues_the_same_stream(fake):
    text, parts, seen, rejected, stored, _ = ask(fake, "recall-late-model", stream=True, thoughts=True)
    assert rejected == []
    # the first round's thought and text reach the client, its call does not; the next round's thought is dropped
    assert [p.get("thought", False) for p in parts if "text" in p] == [True, False, False, False]
    assert text == f"Let me check. recalled {len(BIG)}: big line" and not any("functionCall" in p for p in parts)
    assert [p.get("text") or p["functionCall"]["name"] for p in seen[1]["contents"][-2]["parts"]] == [
        "thinking 1", "Let me check. ", "historygraph_recall"]
    assert stored[6].content == text


@pytest.mark.parametrize("recall, stream, sse", [(False, False, True), (True, True, False)])
def test_off_or_a_stream_not_as_events_the_tool_is_not_offered(fake, recall, stream, sse):
    text, parts, seen, rejected, _, metrics = ask(fake, "recall-model", stream=stream, recall=recall, sse=sse)
    assert rejected == [] and declared(seen[0]) == ["read"] and len(seen) == 2
    assert text == "answer 1" and not any("functionCall" in p for p in parts)  # the fake's usual answer (a results' turn last)
    assert "historygraph_recall_calls_total{" not in metrics


def test_a_chunk_is_split_by_part_and_the_declaration_removed_for_the_last_round():
    fc = {"name": "historygraph_recall", "args": {"ids": ["gemini-1-0"]}}
    chunk = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Let me check. "}, {"functionCall": fc}]},
                             "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 3}}
    one, two = rg.split(chunk)
    assert one == {"candidates": [{"content": {"role": "model", "parts": [{"text": "Let me check. "}]}, "index": 0}],
                   "usageMetadata": {"promptTokenCount": 3}}
    assert two["candidates"][0] == {"content": {"role": "model", "parts": [{"functionCall": fc}]}, "finishReason": "STOP", "index": 0}
    assert [rg.starts(e) for e in (one, two)] == ["output", "recall"]
    assert rg.starts({"candidates": [{"content": {"parts": [{"text": "hm", "thought": True}]}}]}) is None
    body = {"contents": [], "tools": [READ, {"googleSearch": {}}], "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}}}
    assert rg.with_tool(body)["tools"] == [{"functionDeclarations": [*READ["functionDeclarations"], DECLARATION]}, {"googleSearch": {}}]
    assert rg.without_tool(rg.with_tool(body)) == body
    alone = rg.with_tool({"contents": []})
    assert alone["tools"] == [{"functionDeclarations": [DECLARATION]}] and rg.without_tool(alone) == {"contents": []}
