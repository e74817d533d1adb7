"""A recording stand-in for a model provider (OpenAI Chat Completions, OpenAI Responses (its rules and
answers in ``tests/fake_responses.py``), Anthropic Messages and the Gemini API (``tests/fake_gemini.py``)), run
as a real server process by the tests and the benchmarks: ``python tests/fake_upstream.py --port N``.
A test double: it lives with the tests, never in the installed package.

It enforces the providers' documented request rules and answers a violation with 400 in the
provider's error shape, recording it at ``GET /_rejections`` (:func:`openai_violation`,
:func:`anthropic_violation`): pairing and order of calls and results, ``tool_result`` blocks
first in their user turn, server-tool pairs, the extended-thinking rule and thinking signatures,
images, documents, audio and files where each API takes them (:func:`anthropic_block_violation`,
:func:`openai_part_violation`; ``is_error`` a boolean)
(the fake signs what it emits with :func:`sign`; a block whose signature does not match is
rejected, as the provider rejects a modified thinking block), and where a mid-conversation system
message (``{"role": "system"}`` inside ``messages``) may stand (:func:`system_turn_violation`).

With ``--prompt-cache`` it simulates each API's prompt cache and reports every answer's usage as
that provider does (``tests/fake_cache.py``); without it every answer reports a fixed small usage.
The Anthropic limit of 4 ``cache_control`` breakpoints is enforced either way.

It keeps every request it receives (path, headers, JSON body), readable at ``GET /_requests`` and
cleared by ``POST /_reset``. Its answers are deterministic:

* when the request offers ``tools`` and the last message is the user's (not a tool result), it
  calls the first tool with ``{"q": "<n>"}`` (call id ``call_<n>`` / ``toolu_<n>``, ``n`` the request
  count), otherwise it answers with the text ``answer <n>``;
* Anthropic answers start with a ``thinking`` block (text ``thinking <n>``, signature ``sign(text)``);
* model ``error-model`` gets 429 (OpenAI) or 529 (Anthropic) with an error body; model
  ``slow-model`` streams with 0.4 s between events (to observe unbuffered relaying); model
  ``broken-model`` gets a 500; model ``cut-model`` drops the stream after two events; model
  ``short-model`` ends the stream cleanly after two events, without the final one; model
  ``hang-model`` answers only after 4 s;
* a model named ``script-<N>`` gets the scripted answers of ``tests/fake_scripts.py``, which make a
  real agent program do ``N`` steps of work and finish (the ``clients`` tests).

Upstream faults (issue 38, class 3), on either API: model ``truncated-model`` sends the headers of a
non-streamed answer (its full ``Content-Length``) and half of its body, then drops the connection;
``notjson-model`` answers 200 with an HTML page (a gateway's, not JSON); ``badtool-model`` streams
a ``tool_use`` whose ``input_json_delta`` pieces never make a complete JSON object, then ends the
stream normally (``message_stop``; Anthropic only).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

import fake_cache
import fake_scripts

OPENAI_ERROR = {"error": {"message": "fake upstream: rate limit reached", "type": "rate_limit_error", "code": "rate_limited"}}
ANTHROPIC_ERROR = {"type": "error", "error": {"type": "overloaded_error", "message": "fake upstream: overloaded"}}


def sign(thinking: str) -> str:
    """The fake's signature of a thinking text (the provider's is opaque; this one is checkable)."""
    return "sig-" + hashlib.sha256(thinking.encode()).hexdigest()[:24]


def openai_violation(messages: list[Any]) -> str | None:
    """The first Chat Completions rule ``messages`` breaks, or ``None``: an assistant message with
    ``tool_calls`` must be followed directly by one ``tool`` message per call id, and a ``tool``
    message must answer a call of that assistant message (OpenAI: "An assistant message with
    'tool_calls' must be followed by tool messages responding to each 'tool_call_id'")."""
    if (why := openai_part_violation(messages)) is not None:
        return why
    i = 0
    while i < len(messages):
        m = messages[i]
        if not isinstance(m, dict):
            return f"messages[{i}]: not an object"
        if m.get("role") == "tool":
            return f"messages[{i}]: a 'tool' message must be a response to a preceding message with 'tool_calls'"
        if m.get("role") == "assistant" and m.get("tool_calls"):
            ids = [c.get("id") for c in m["tool_calls"]]
            j, got = i + 1, []
            while j < len(messages) and isinstance(messages[j], dict) and messages[j].get("role") == "tool":
                got.append(messages[j].get("tool_call_id"))
                j += 1
            last = i == len(messages) - 1
            if not last and sorted(got) != sorted(ids):
                return (f"messages[{i}]: an assistant message with 'tool_calls' must be followed by tool messages "
                        f"responding to each 'tool_call_id' (calls {ids}, results {got})")
            i = j
            continue
        i += 1
    return None


IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


TOOL_RESULT_BLOCKS = ("text", "image", "document", "search_result", "tool_reference", "browser_state")


def anthropic_block_violation(b: Any, where: str, role: str) -> str | None:
    """The first Messages API rule one content block breaks, or ``None``: ``image`` blocks (in user
    turns and ``tool_result`` content only) have a ``base64`` source with a supported
    ``media_type`` and ``data``, or a ``url`` or ``file`` source; ``document`` blocks a
    ``base64`` PDF, a ``text`` source with ``data``, a ``url``, ``content`` or ``file`` source;
    a ``tool_result``'s ``is_error`` is a boolean and its ``content`` a string or a list of
    ``text``, ``image``, ``document``, ``search_result``, ``tool_reference`` and ``browser_state``
    blocks, each valid (Anthropic "Vision", "PDF support", "Tool use": "Handling tool results"; the
    SDK's ``ToolResultBlockParam.content``: Claude Code's tool search answers with
    ``tool_reference`` blocks)."""
    if not isinstance(b, dict):
        return f"{where}: Input should be a valid dictionary"
    kind = b.get("type")
    if kind in ("image", "document"):
        if role != "user":
            return f"{where}: {kind} blocks are only allowed in user messages"
        src = b.get("source")
        stype = src.get("type") if isinstance(src, dict) else None
        if kind == "image" and stype == "base64" and (src.get("media_type") not in IMAGE_TYPES or not isinstance(src.get("data"), str)):
            return f"{where}.source: an image needs media_type one of {IMAGE_TYPES} and base64 data"
        if kind == "document" and stype == "base64" and (src.get("media_type") != "application/pdf" or not isinstance(src.get("data"), str)):
            return f"{where}.source: a base64 document must be application/pdf with data"
        if kind == "document" and stype == "text" and not isinstance(src.get("data"), str):
            return f"{where}.source.data: Field required"
        allowed = ("base64", "url", "file") + (("text", "content") if kind == "document" else ())
        if stype not in allowed:
            return f"{where}.source.type: Input tag {stype!r} does not match any of the expected tags: {allowed}"
    if kind == "tool_result":
        if "is_error" in b and not isinstance(b["is_error"], bool):
            return f"{where}.is_error: Input should be a valid boolean"
        content = b.get("content")
        if isinstance(content, list):
            for n, c in enumerate(content):
                if not isinstance(c, dict) or c.get("type") not in TOOL_RESULT_BLOCKS:
                    return f"{where}.content.{n}: tool_result content blocks are one of {TOOL_RESULT_BLOCKS}"
                if (why := anthropic_block_violation(c, f"{where}.content.{n}", role)) is not None:
                    return why
        elif content is not None and not isinstance(content, str):
            return f"{where}.content: a string or a list of blocks"
    return None


def openai_part_violation(messages: list[Any]) -> str | None:
    """The first Chat Completions content-part rule ``messages`` breaks, or ``None``: ``image_url``,
    ``input_audio`` and ``file`` parts only in user messages, an ``image_url`` with a ``url``, an
    ``input_audio`` with base64 ``data`` and ``format`` ``wav`` or ``mp3``, a ``file`` with
    ``file_data`` or ``file_id`` (OpenAI API reference, "Create chat completion": the message
    content parts of each role)."""
    for i, m in enumerate(messages):
        parts = m.get("content") if isinstance(m, dict) else None
        if not isinstance(parts, list):
            continue
        for j, p in enumerate(parts):
            kind = p.get("type") if isinstance(p, dict) else None
            where = f"messages[{i}].content[{j}]"
            if kind in ("image_url", "input_audio", "file") and m.get("role") != "user":
                return f"{where}: Invalid value: '{kind}'. Supported values for role {m.get('role')} are text parts"
            if kind == "image_url" and not isinstance((p.get("image_url") or {}).get("url"), str):
                return f"{where}.image_url.url: Missing required parameter"
            if kind == "input_audio" and ((p.get("input_audio") or {}).get("format") not in ("wav", "mp3")
                                          or not isinstance((p.get("input_audio") or {}).get("data"), str)):
                return f"{where}.input_audio: data and a format of 'wav' or 'mp3' are required"
            if kind == "file" and not ({"file_data", "file_id"} & set(p.get("file") or {})):
                return f"{where}.file: file_data or file_id is required"
    return None


def _merged(turns: list[Any]) -> list[dict[str, Any]]:
    """Consecutive turns of one role combined into one, as the Messages API does."""
    out: list[dict[str, Any]] = []
    for t in turns:
        blocks = t["content"] if isinstance(t.get("content"), list) else [{"type": "text", "text": t.get("content")}]
        if out and out[-1]["role"] == t.get("role"):
            out[-1]["content"] += blocks
        else:
            out.append({"role": t.get("role"), "content": list(blocks)})
    return out


def system_turn_violation(turns: list[dict[str, Any]]) -> str | None:
    """The first placement rule a mid-conversation system message of ``turns`` (the raw
    ``messages``) breaks, or ``None``. As the Messages API documents them ("Mid-conversation
    system messages"): never ``messages[0]``; its content a string or text blocks; a run of
    system messages comes right after a user turn (or an assistant turn that ends with a
    ``server_tool_use`` block) and is followed by an assistant turn or ends the list."""
    roles = [t.get("role") for t in turns]
    for k, t in enumerate(turns):
        if roles[k] not in ("user", "assistant", "system"):
            return f"messages.{k}.role: Input should be 'user', 'assistant' or 'system'"
        if roles[k] != "system":
            continue
        content = t.get("content")
        if not isinstance(content, str) and not (isinstance(content, list) and content
                                                 and all(isinstance(b, dict) and b.get("type") == "text" for b in content)):
            return f"messages.{k}.content: a system message holds a string or text blocks"
        start = k
        while start and roles[start - 1] == "system":
            start -= 1
        before = turns[start - 1] if start else None
        end = k
        while end + 1 < len(turns) and roles[end + 1] == "system":
            end += 1
        after = roles[end + 1] if end + 1 < len(turns) else None
        ends_server_tool = before is not None and before.get("role") == "assistant" and isinstance(before.get("content"), list) \
            and bool(before["content"]) and isinstance(before["content"][-1], dict) and before["content"][-1].get("type") == "server_tool_use"
        if before is None or not (before.get("role") == "user" or ends_server_tool):
            return f"messages.{k}: a system message must follow a user message"
        if after not in (None, "assistant"):
            return f"messages.{k}: a system message must be followed by an assistant message or be the last message"
    return None


MAX_CACHE_BREAKPOINTS = 4


def cache_control_violation(body: dict[str, Any]) -> str | None:
    """The first prompt-caching rule ``body`` breaks, or ``None``: at most
    :data:`MAX_CACHE_BREAKPOINTS` blocks with ``cache_control`` (tools, system blocks, message
    content blocks; a top-level ``cache_control`` counts as one), none on a thinking block, and no
    1-hour breakpoint after a 5-minute one in request order (tools, system, messages)
    (docs.anthropic.com/en/docs/build-with-claude/prompt-caching, "Mixing different TTLs")."""
    blocks = list(body.get("tools") or []) + (body["system"] if isinstance(body.get("system"), list) else [])
    for t in body.get("messages") or []:
        blocks += t["content"] if isinstance(t, dict) and isinstance(t.get("content"), list) else []
    marked = [b for b in blocks if isinstance(b, dict) and "cache_control" in b]
    n = len(marked) + ("cache_control" in body)
    if n > MAX_CACHE_BREAKPOINTS:
        return f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {n}."
    if any(b.get("type") in ("thinking", "redacted_thinking") for b in marked):
        return "messages: cache_control cannot be set on thinking blocks"
    ttls = [b["cache_control"].get("ttl", "5m") for b in marked]
    if any(a == "5m" and b == "1h" for a, b in zip(ttls, ttls[1:])):
        return "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block"
    return None


def beta_violation(body: dict[str, Any], headers: Any) -> str | None:
    """A ``"ttl": "1h"`` breakpoint in a request whose ``anthropic-beta`` header lacks
    ``extended-cache-ttl-2025-04-11`` (Anthropic, "Prompt caching": the 1-hour cache duration needs
    that beta; requests without it are refused), else ``None``."""
    system = body.get("system")
    blocks = [*(body.get("tools") or []), *(system if isinstance(system, list) else [])]
    for turn in body.get("messages") or []:
        content = turn.get("content") if isinstance(turn, dict) else None
        blocks += content if isinstance(content, list) else []
    marks = [body.get("cache_control"), *(b.get("cache_control") for b in blocks if isinstance(b, dict))]
    betas = {b.strip() for b in (headers.get("anthropic-beta") or "").split(",")}
    if any(isinstance(cc, dict) and cc.get("ttl") == "1h" for cc in marks) and "extended-cache-ttl-2025-04-11" not in betas:
        return "cache_control.ttl '1h' needs the anthropic-beta header extended-cache-ttl-2025-04-11"
    return None


def anthropic_violation(body: dict[str, Any]) -> str | None:
    """The first Messages API rule ``body`` breaks, or ``None`` (the prompt-caching limits
    (:func:`cache_control_violation`), where system messages stand
    (:func:`system_turn_violation`), then, without them, turns of one role merged):
    every ``tool_use`` is answered by a ``tool_result`` in the next user turn, all ``tool_result``
    blocks come first in that turn and answer a ``tool_use`` of the turn before; each
    ``server_tool_use`` is followed in its turn by its result block; with ``thinking`` enabled the
    first assistant turn of the active tool loop starts with a ``thinking``/``redacted_thinking``
    block; every thinking block carries the signature the fake gave it."""
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        return "messages: a non-empty list of objects is required"
    if (why := cache_control_violation(body)) is not None:
        return why
    if (why := system_turn_violation(turns)) is not None:
        return why
    for k, t in enumerate(turns):
        for n, b in enumerate(t.get("content") if isinstance(t.get("content"), list) else []):
            if (why := anthropic_block_violation(b, f"messages.{k}.content.{n}", t.get("role"))) is not None:
                return why
    turns = _merged([t for t in turns if t.get("role") != "system"])
    if turns[0]["role"] != "user":
        return "messages: the first message must use the user role"
    for k, t in enumerate(turns):
        blocks = t["content"]
        if t["role"] == "assistant":
            served = {b.get("tool_use_id") for b in blocks if isinstance(b, dict) and str(b.get("type", "")).endswith("_tool_result")}
            for b in blocks:
                if b.get("type") == "server_tool_use" and b.get("id") not in served:
                    return f"messages.{k}: server_tool_use {b.get('id')} has no result block in its turn"
                if b.get("type") == "thinking" and b.get("signature") != sign(str(b.get("thinking", ""))):
                    return f"messages.{k}: invalid signature in thinking block"
            uses = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
            if uses and k + 1 < len(turns):
                nxt = turns[k + 1]["content"]
                n = 0
                while n < len(nxt) and nxt[n].get("type") == "tool_result":
                    n += 1
                if sorted(b.get("tool_use_id") for b in nxt[:n]) != sorted(uses):
                    return (f"messages.{k + 1}: tool_use ids were found without tool_result blocks immediately after: "
                            f"{uses} (tool_result blocks must come first in the next user turn)")
        else:
            results = [(n, b) for n, b in enumerate(blocks) if isinstance(b, dict) and b.get("type") == "tool_result"]
            prev = turns[k - 1]["content"] if k else []
            uses = {b.get("id") for b in prev if isinstance(b, dict) and b.get("type") == "tool_use"}
            for n, b in results:
                if b.get("tool_use_id") not in uses or any(x.get("type") != "tool_result" for x in blocks[:n]):
                    return f"messages.{k}.content.{n}: unexpected tool_use_id {b.get('tool_use_id')} in tool_result block"
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled" and turns[-1]["role"] == "user" \
            and any(b.get("type") == "tool_result" for b in turns[-1]["content"]):
        start = max((k for k, t in enumerate(turns) if t["role"] == "user"
                     and not any(b.get("type") == "tool_result" for b in t["content"])), default=-1) + 1
        first = next((t for t in turns[start:] if t["role"] == "assistant"), None)
        if first is not None and (not first["content"] or first["content"][0].get("type") not in ("thinking", "redacted_thinking")):
            return ("messages: Expected `thinking` or `redacted_thinking`, but found "
                    f"`{first['content'][0].get('type') if first['content'] else 'nothing'}`. When `thinking` is enabled, "
                    "a final `assistant` message must start with a thinking block")
    return None


def openai_call(body: dict[str, Any], n: int) -> dict[str, Any] | None:
    """The tool call the fake answers request ``n`` with, or ``None`` (it answers with text): the
    first tool, when the request offers tools and its last message is the user's."""
    last = (body.get("messages") or [{}])[-1]
    if not (body.get("tools") and isinstance(last, dict) and last.get("role") == "user"):
        return None
    return {"id": f"call_{n}", "type": "function",
            "function": {"name": body["tools"][0]["function"]["name"], "arguments": json.dumps({"q": str(n)})}}


def openai_answer(body: dict[str, Any], n: int) -> dict[str, Any]:
    """The non-streamed Chat Completions answer to request ``n`` (see module docstring)."""
    call = openai_call(body, n)
    msg: dict[str, Any] = {"role": "assistant", "content": None if call else f"answer {n}"}
    if call:
        msg["tool_calls"] = [call]
    return {"id": f"chatcmpl-{n}", "created": 0, "model": body.get("model", "fake-model"), "object": "chat.completion",
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if call else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def lean_app() -> Any:
    """The fake as a bare ASGI app for load benchmarks (``--lean``): non-streamed Chat Completions
    only, with the same rule check (:func:`openai_violation`, 400 and a record at ``GET
    /_rejections``) and the same answers (:func:`openai_answer`), but without FastAPI and without
    keeping the bodies it received (``GET /_requests`` gives only their count), so that its own
    CPU per request stays small beside the proxy's on a shared machine. ``POST /_reset`` clears."""
    import msgspec

    decode, encode = msgspec.json.Decoder().decode, msgspec.json.Encoder().encode
    state: dict[str, Any] = {"n": 0, "rejected": []}

    async def reply(send: Any, status: int, value: Any) -> None:
        data = encode(value)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        route = (scope["method"], scope["path"])
        if route == ("GET", "/_requests"):
            return await reply(send, 200, {"count": state["n"]})
        if route == ("GET", "/_rejections"):
            return await reply(send, 200, state["rejected"])
        if route == ("POST", "/_reset"):
            state["n"], state["rejected"] = 0, []
            return await reply(send, 200, {"cleared": 1})
        if route != ("POST", "/v1/chat/completions"):
            return await reply(send, 404, {"error": {"message": f"lean fake: no route {route}", "type": "not_found"}})
        try:
            body = decode(b"".join(chunks))
        except msgspec.DecodeError:
            body = json.loads(b"".join(chunks))  # what msgspec refuses (NaN literals), as the full fake reads it
        state["n"] += 1
        if body.get("stream"):
            return await reply(send, 400, {"error": {"message": "lean fake: streaming is not served", "type": "invalid_request_error"}})
        if (why := openai_violation(body.get("messages") or [])) is not None:
            state["rejected"].append({"path": scope["path"], "error": why, "body": body})
            return await reply(send, 400, {"error": {"message": why, "type": "invalid_request_error", "param": "messages", "code": None}})
        await reply(send, 200, openai_answer(body, state["n"]))

    return app


def build_app(prompt_cache: bool = False) -> FastAPI:
    """The fake; ``prompt_cache``: simulate each API's prompt cache and report usage from it
    (``tests/fake_cache.py``), else every answer reports a fixed small usage."""
    app = FastAPI()
    seen: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    caches = fake_cache.PromptCaches() if prompt_cache else None

    def usage(api: str, body: dict[str, Any], reply: Any) -> Any:
        """``reply`` with the usage the simulated cache gives (unchanged without ``prompt_cache``)."""
        return reply if caches is None else fake_cache.with_usage(reply, caches.usage(api, body))

    async def record(request: Request) -> dict[str, Any]:
        body = await request.json()
        seen.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        return body

    @app.get("/_requests")
    async def requests() -> list[dict[str, Any]]:
        return seen

    @app.get("/_rejections")
    async def rejections() -> list[dict[str, Any]]:
        return rejected

    @app.post("/_reset")
    async def reset() -> dict[str, int]:
        seen.clear()
        rejected.clear()
        return {"cleared": 1}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        if "anthropic-version" in request.headers:  # Anthropic's list shape
            return {"data": [{"type": "model", "id": "fake-claude", "display_name": "Fake", "created_at": "2025-01-01T00:00:00Z"}],
                    "has_more": False, "first_id": "fake-claude", "last_id": "fake-claude"}
        return {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await record(request)
        if (why := openai_violation(body.get("messages") or [])) is not None:
            rejected.append({"path": "/v1/chat/completions", "error": why, "body": body})
            return JSONResponse({"error": {"message": why, "type": "invalid_request_error", "param": "messages",
                                           "code": None}}, 400)
        if (fault := faulty(body, lambda: openai_answer(body, len(seen)))) is not None:
            return fault
        if body.get("model") == "error-model":
            return JSONResponse(OPENAI_ERROR, 429, headers={"x-fake": "1"})
        if fake_scripts.script_of(body.get("model")):
            return _scripted(usage("openai", body, fake_scripts.openai_reply(body, len(seen))), body)
        if body.get("model") == "hang-model":
            await asyncio.sleep(4)  # longer than the proxy's --timeout 1 in the tests
        if body.get("model") == "broken-model":
            return JSONResponse({"error": {"message": "internal error", "type": "server_error"}}, 500)
        n = len(seen)
        call = openai_call(body, n)
        base = {"id": f"chatcmpl-{n}", "created": 0, "model": body.get("model", "fake-model")}
        if not body.get("stream"):
            return usage("openai", body, openai_answer(body, n))

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
        events.append(chunk({}, "tool_calls" if call else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):  # the usage chunk: no choices
            events.append("data: " + json.dumps({**base, "object": "chat.completion.chunk", "choices": [],
                                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}) + "\n\n")
        events.append("data: [DONE]\n\n")
        return StreamingResponse(_paced(usage("openai", body, events), body), media_type="text/event-stream")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        body = await record(request)
        if (why := anthropic_violation(body) or beta_violation(body, request.headers)) is not None:
            rejected.append({"path": "/v1/messages", "error": why, "body": body})
            return JSONResponse({"type": "error", "error": {"type": "invalid_request_error", "message": why}}, 400)
        if body.get("model") == "error-model":
            return JSONResponse(ANTHROPIC_ERROR, 529)
        if fake_scripts.script_of(body.get("model")):
            return _scripted(usage("anthropic", body, fake_scripts.anthropic_reply(body, len(seen), sign)), body)
        n = len(seen)
        if (fault := faulty(body, lambda: {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": "m",
                                           "content": [{"type": "text", "text": f"answer {n}"}], "stop_reason": "end_turn",
                                           "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}})) is not None:
            return fault
        last = (body.get("messages") or [{}])[-1]
        content = last.get("content")
        answers_tool = isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)
        blocks: list[dict[str, Any]] = [{"type": "thinking", "thinking": f"thinking {n}", "signature": sign(f"thinking {n}")}]
        if (body.get("tools") and last.get("role") == "user" and not answers_tool) or body.get("model") == "badtool-model":
            blocks.append({"type": "tool_use", "id": f"toolu_{n}", "name": body["tools"][0]["name"], "input": {"q": str(n)}})
        else:
            blocks.append({"type": "text", "text": f"answer {n}"})
        stop = "tool_use" if blocks[-1]["type"] == "tool_use" else "end_turn"
        msg = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": body.get("model", "fake-model"),
               "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
        if not body.get("stream"):
            return usage("anthropic", body, {**msg, "content": blocks, "stop_reason": stop})

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
                if body.get("model") == "badtool-model":
                    args = args[:-3]  # the object is never closed
                events += [ev("content_block_start", index=i, content_block={**b, "input": {}})]
                events += [ev("content_block_delta", index=i, delta={"type": "input_json_delta", "partial_json": args[j:j + 5]})
                           for j in range(0, len(args), 5)]
            else:
                events += [ev("content_block_start", index=i, content_block={"type": "text", "text": ""}),
                           ev("content_block_delta", index=i, delta={"type": "text_delta", "text": b["text"]})]
            events.append(ev("content_block_stop", index=i))
        events += [ev("message_delta", delta={"stop_reason": stop, "stop_sequence": None}, usage={"output_tokens": 1}),
                   ev("message_stop")]
        return StreamingResponse(_paced(usage("anthropic", body, events), body), media_type="text/event-stream")

    from fake_responses import add_routes  # the Responses API (imported here: it imports sign from this module)

    add_routes(app, record, rejected, seen, _paced, usage)
    from fake_gemini import add_routes as add_gemini  # the Gemini API

    add_gemini(app, record, rejected, seen, _paced)
    return app


def faulty(body: dict[str, Any], answer: Any) -> Any:
    """The fault response the request's model names (module docstring), or ``None``; ``answer()``:
    the answer a fault-free request would get, non-streamed."""
    model = body.get("model")
    if model == "notjson-model":
        return HTMLResponse("<html><body><h1>502 Bad Gateway</h1></body></html>", 200)
    if model == "truncated-model" and not body.get("stream"):
        data = json.dumps(answer()).encode()

        async def half() -> AsyncIterator[bytes]:
            yield data[:len(data) // 2]
            raise ConnectionError("body cut after the headers (truncated-model)")

        return StreamingResponse(half(), 200, {"content-length": str(len(data))}, media_type="application/json")
    return None


def _scripted(reply: dict[str, Any] | list[str], body: dict[str, Any]) -> Any:
    return StreamingResponse(_paced(reply, body), media_type="text/event-stream") if isinstance(reply, list) else reply


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
    ap.add_argument("--lean", action="store_true", help="the bare ASGI fake of the load benchmarks (lean_app)")
    ap.add_argument("--prompt-cache", action="store_true",
                    help="simulate each API's prompt cache and report usage as the provider does (tests/fake_cache.py)")
    args = ap.parse_args()
    uvicorn.run(lean_app() if args.lean else build_app(args.prompt_cache), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
