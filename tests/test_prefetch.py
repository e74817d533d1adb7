"""The proxy's background prefetch (Proxy.prefetch): once an answer that calls tools is stored,
ContextRender embeds its next query text off the request path; what is forwarded is unchanged."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import numpy as np

from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig


class CountingEmbedder:
    """Deterministic unit vectors from a text's hash; ``texts`` records what reached the model."""

    model, dim = "counting-test-embedder", 8

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts.extend(texts)
        out = np.array([[b - 127.5 for b in hashlib.sha256(t.encode()).digest()[:8]] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True) if len(texts) else out.reshape(0, 8)


def history() -> list[dict]:
    out = [{"role": "system", "content": "agent"}, {"role": "user", "content": "Fix the parser."}]
    for i in range(6):
        out.append({"role": "assistant", "content": f"step {i}", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]})
        out.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i} " + "word " * 150})
    return out


def run(prefetch: bool) -> tuple[list[dict], list[list[str]]]:
    """Two requests through an in-process proxy (contextrender, B = 400); returns the forwarded
    bodies and, per request, the texts the embedder computed while it was handled."""
    forwarded: list[dict] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        forwarded.append(json.loads(request.content))
        call = {"id": f"n{len(forwarded)}", "type": "function", "function": {"name": "bash", "arguments": '{"q": "1"}'}}
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": "m", "created": 0, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "next", "tool_calls": [call]}, "finish_reason": "tool_calls"}]})

    app = create_app(ServerConfig(upstream="http://upstream/v1", store=":memory:", policy="contextrender", budget=400,
                                  calibrate=False))
    proxy = app.state.proxy
    proxy.transport = httpx.MockTransport(upstream)
    embedder = CountingEmbedder()
    proxy.signals.embedder_factory = lambda: embedder
    if not prefetch:
        proxy.prefetch = lambda *args: None
    per_request: list[list[str]] = []

    async def go() -> None:
        msgs = history()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            for _ in range(2):
                before = len(embedder.texts)
                r = await c.post("/v1/chat/completions", json={"model": "m", "messages": msgs, "tools": []},
                                 headers={"X-HistoryGraph-Session": "p"})
                assert r.status_code == 200, r.text
                per_request.append(embedder.texts[before:])
                answer = r.json()["choices"][0]["message"]
                msgs = msgs + [answer, {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"],
                                        "content": "new result " + "token " * 120}]

    asyncio.run(go())
    return forwarded, per_request


def test_the_next_query_text_is_embedded_after_the_answer_and_nothing_forwarded_changes():
    with_prefetch, texts = run(True)
    without, texts_without = run(False)
    assert with_prefetch == without  # same forwarded bodies
    # without prefetch the second request embeds the new result and the new query text f_t ...
    assert len(texts_without[1]) == 2 and texts_without[1][0].startswith("new result")
    # ... with it, f_t (latest user message + the answer that called the tool) was embedded after
    # the first answer, so the second request embeds only the new result
    assert [t[:10] for t in texts[1]] == ["new result"]
    assert texts_without[1][1] == "Fix the parser.\nnext\nbash {\"q\": \"1\"}"
