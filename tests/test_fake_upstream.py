"""The lean fake provider of the load benchmarks (``tests/fake_upstream.py --lean``) against the
tests' full fake: the same 400 for a request the provider would reject, the same answers."""

from __future__ import annotations

import asyncio

import httpx

from fake_upstream import build_app, lean_app

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
GOOD = [{"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "hi"}]},
        {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                                     {"role": "tool", "tool_call_id": "c1", "content": "out"}]}]
# a tool result whose call was dropped: the provider's 400
BAD = {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c1", "content": "out"}]}


def _exchange(app) -> list[tuple[int, dict]]:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://up") as c:
            out = []
            for body in [*GOOD, BAD]:
                r = await c.post("/v1/chat/completions", json=body)
                out.append((r.status_code, r.json()))
            rejected = (await c.get("/_rejections")).json()
            return out, rejected
    return asyncio.run(go())


def test_lean_fake_rejects_and_answers_as_the_full_fake():
    full, full_rejected = _exchange(build_app())
    lean, lean_rejected = _exchange(lean_app())
    assert [s for s, _ in lean] == [200, 200, 400]
    assert lean == full
    assert lean[0][1]["choices"][0]["message"]["tool_calls"][0]["id"] == "call_1"  # a tool call after the user's message
    assert lean[1][1]["choices"][0]["message"]["content"] == "answer 2"  # text after a tool result
    assert [r["error"] for r in lean_rejected] == [r["error"] for r in full_rejected] and len(lean_rejected) == 1
