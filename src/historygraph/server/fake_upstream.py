"""A recording stand-in for a model provider (OpenAI Chat Completions and Anthropic Messages), run
as a real server process by the tests and the benchmark: ``python -m
historygraph.server.fake_upstream --port N``.

It keeps every request it receives (path, headers, JSON body), readable at ``GET /_requests`` and
cleared by ``POST /_reset``. Its answers are deterministic:

* when the request offers ``tools`` and the last message is the user's (not a tool result), it
  calls the first tool with ``{"q": "<n>"}`` (call id ``call_<n>`` / ``toolu_<n>``, ``n`` the request
  count), otherwise it answers with the text ``answer <n>``;
* Anthropic answers start with a ``thinking`` block (text ``thinking <n>``, signature ``sig<n>``);
* model ``error-model`` gets 429 (OpenAI) or 529 (Anthropic) with an error body; model
  ``slow-model`` streams with 0.4 s between events (to observe unbuffered relaying); model
  ``broken-model`` gets a 500; model ``cut-model`` drops the stream after two events; model
  ``short-model`` ends the stream cleanly after two events, without the final one; model
  ``hang-model`` answers only after 4 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

OPENAI_ERROR = {"error": {"message": "fake upstream: rate limit reached", "type": "rate_limit_error", "code": "rate_limited"}}
ANTHROPIC_ERROR = {"type": "error", "error": {"type": "overloaded_error", "message": "fake upstream: overloaded"}}


def build_app() -> FastAPI:
    app = FastAPI()
    seen: list[dict[str, Any]] = []

    async def record(request: Request) -> dict[str, Any]:
        body = await request.json()
        seen.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        return body

    @app.get("/_requests")
    async def requests() -> list[dict[str, Any]]:
        return seen

    @app.post("/_reset")
    async def reset() -> dict[str, int]:
        seen.clear()
        return {"cleared": 1}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await record(request)
        if body.get("model") == "error-model":
            return JSONResponse(OPENAI_ERROR, 429, headers={"x-fake": "1"})
        if body.get("model") == "hang-model":
            await asyncio.sleep(4)  # longer than the proxy's --timeout 1 in the tests
        if body.get("model") == "broken-model":
            return JSONResponse({"error": {"message": "internal error", "type": "server_error"}}, 500)
        n = len(seen)
        last = (body.get("messages") or [{}])[-1]
        call = None
        if body.get("tools") and last.get("role") == "user":
            call = {"id": f"call_{n}", "type": "function",
                    "function": {"name": body["tools"][0]["function"]["name"], "arguments": json.dumps({"q": str(n)})}}
        text = None if call else f"answer {n}"
        base = {"id": f"chatcmpl-{n}", "created": 0, "model": body.get("model", "fake-model")}
        if not body.get("stream"):
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if call:
                msg["tool_calls"] = [call]
            return {**base, "object": "chat.completion",
                    "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if call else "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return "data: " + json.dumps({**base, "object": "chat.completion.chunk",
                                          "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"

        events = [chunk({"role": "assistant", "content": None if call else ""})]
        if call:
            args = call["function"]["arguments"]
            events.append(chunk({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                                 "function": {"name": call["function"]["name"], "arguments": ""}}]}))
            events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 4]}}]})
                       for i in range(0, len(args), 4)]
        else:
            events += [chunk({"content": piece}) for piece in ("answer", " ", str(n))]
        events += [chunk({}, "tool_calls" if call else "stop"), "data: [DONE]\n\n"]
        return StreamingResponse(_paced(events, body), media_type="text/event-stream")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        body = await record(request)
        if body.get("model") == "error-model":
            return JSONResponse(ANTHROPIC_ERROR, 529)
        n = len(seen)
        last = (body.get("messages") or [{}])[-1]
        content = last.get("content")
        answers_tool = isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)
        blocks: list[dict[str, Any]] = [{"type": "thinking", "thinking": f"thinking {n}", "signature": f"sig{n}"}]
        if body.get("tools") and last.get("role") == "user" and not answers_tool:
            blocks.append({"type": "tool_use", "id": f"toolu_{n}", "name": body["tools"][0]["name"], "input": {"q": str(n)}})
        else:
            blocks.append({"type": "text", "text": f"answer {n}"})
        stop = "tool_use" if blocks[-1]["type"] == "tool_use" else "end_turn"
        msg = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": body.get("model", "fake-model"),
               "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
        if not body.get("stream"):
            return {**msg, "content": blocks, "stop_reason": stop}

        def ev(kind: str, **data: Any) -> str:
            return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"

        events = [ev("message_start", message={**msg, "content": [], "stop_reason": None})]
        for i, b in enumerate(blocks):
            if b["type"] == "thinking":
                events += [ev("content_block_start", index=i, content_block={"type": "thinking", "thinking": ""}),
                           ev("content_block_delta", index=i, delta={"type": "thinking_delta", "thinking": b["thinking"]}),
                           ev("content_block_delta", index=i, delta={"type": "signature_delta", "signature": b["signature"]})]
            elif b["type"] == "tool_use":
                args = json.dumps(b["input"])
                events += [ev("content_block_start", index=i, content_block={**b, "input": {}})]
                events += [ev("content_block_delta", index=i, delta={"type": "input_json_delta", "partial_json": args[j:j + 5]})
                           for j in range(0, len(args), 5)]
            else:
                events += [ev("content_block_start", index=i, content_block={"type": "text", "text": ""}),
                           ev("content_block_delta", index=i, delta={"type": "text_delta", "text": b["text"]})]
            events.append(ev("content_block_stop", index=i))
        events += [ev("message_delta", delta={"stop_reason": stop, "stop_sequence": None}, usage={"output_tokens": 1}),
                   ev("message_stop")]
        return StreamingResponse(_paced(events, body), media_type="text/event-stream")

    return app


async def _paced(events: list[str], body: dict[str, Any]) -> AsyncIterator[bytes]:
    for i, e in enumerate(events):
        if body.get("model") == "cut-model" and i == 2:
            raise ConnectionError("stream cut mid-way (cut-model)")  # the connection drops, no final event
        if body.get("model") == "short-model" and i == 2:
            return  # the stream ends cleanly, without its final event
        yield e.encode()
        if body.get("model") == "slow-model":
            await asyncio.sleep(0.4)


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(build_app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
