"""A scripted Claude Code-shaped session through the proxy's ``/v1/messages``, in process, in front
of a provider that enforces the Messages API's rules and simulates Anthropic's prompt cache. A test
double: it lives with the tests (tests/test_proxy_stable.py; issue 49 item 1).

What the client sends is shaped like Claude Code's requests: the tools ``Read``, ``Edit``, ``Bash``
and ``Grep`` with JSON schemas; a ``system`` of two text blocks, each with a ``cache_control``
breakpoint; content always as block lists; the last two messages' last blocks marked with
``cache_control`` (so each breakpoint moves on at the next call, and the message that carried it is
re-sent without it: the client's own edit of earlier messages); answers streamed, assembled by the
client from the events (:func:`sse`, :func:`assembled`); a ``<system-reminder>`` text block
after the tool result at every 7th call; and one new user instruction halfway.

The model (:func:`answer`) is scripted from the request alone, as ``tests/fake_scripts.py`` is: step
``k`` is one more than the largest ``hgs<k>_`` marker in the request's tool call ids (the newest
step is always forwarded), and each step calls one of the four tools in turn, with a thinking block
every 3rd step; step :data:`TEXT_STEP` answers with text (the client then writes a new instruction).
The client runs the tool itself (:func:`tool_output`): results grow with the step, from about 100
to about 1,500 tokens, and step :data:`BIG_STEP` reads a file of about 33,000 tokens (larger than
the budgets tried: the proxy shows an excerpt of it).

:func:`run` drives ``calls`` calls and returns each forwarded request body and each answer's usage;
:func:`bill` prices the usage with Anthropic's multipliers (cache writes 1.25×, reads 0.1× the
input price: docs.anthropic.com/en/docs/build-with-claude/prompt-caching).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

import fake_cache
from fake_upstream import anthropic_violation, beta_violation, sign

CC = {"type": "ephemeral"}
TEXT_STEP = 30
BIG_STEP = 44
TOOLS = [
    {"name": "Read", "description": "Reads a file from the local filesystem.", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}, "offset": {"type": "number"},
                                         "limit": {"type": "number"}}, "required": ["file_path"]}},
    {"name": "Edit", "description": "Performs exact string replacements in files.", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}, "old_string": {"type": "string"},
                                         "new_string": {"type": "string"}}, "required": ["file_path", "old_string", "new_string"]}},
    {"name": "Bash", "description": "Executes a given bash command.", "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"]}},
    {"name": "Grep", "description": "A search tool built on ripgrep.", "input_schema": {
        "type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}}, "required": ["pattern"]}},
]
SYSTEM = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": CC},
          {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks. "
           + " ".join(f"Guideline {i}: read before you edit, run the tests after each change, keep answers short."
                      for i in range(60)), "cache_control": CC}]
TASK = "The parser in src/mod3.py drops the last field of each record. Find out why, fix it and make the tests pass."
FOLLOW_UP = "Thanks. Now add a test for records with an empty last field, and run the whole suite again."
MARK = re.compile(r"hgs(\d+)_")


def _step(body: dict[str, Any]) -> int:
    """One more than the largest step marker in the request's assistant turns."""
    marks = [int(m) for msg in body.get("messages", []) if msg.get("role") == "assistant"
             for m in MARK.findall(json.dumps(msg.get("content")))]
    return max(marks, default=0) + 1


def tool_input(k: int) -> tuple[str, dict[str, Any]]:
    """The tool step ``k`` calls and its input (the four tools in turn)."""
    f = f"src/mod{k % 9}.py"
    return [("Read", {"file_path": f"/repo/{f}"}),
            ("Grep", {"pattern": f"def parse_{k % 5}", "path": "/repo/src"}),
            ("Edit", {"file_path": f"/repo/{f}", "old_string": f"fields[:-1]  # {k}", "new_string": f"fields  # {k}"}),
            ("Bash", {"command": f"python -m pytest tests/test_mod{k % 9}.py -q", "description": "Run the tests"})][k % 4]


def tool_output(k: int, name: str) -> str:
    """What the client's tool prints at step ``k``: longer as the session goes on."""
    n = 6 + k // 3
    if name == "Read" and k == BIG_STEP:  # a whole generated file, larger than the budgets tried
        return "\n".join(f"{i:6d}\tTABLE_{i} = {{'id': {i}, 'name': 'row{i}', 'weight': {i * 7 % 101}}}" for i in range(1, 1200))
    if name == "Read":
        return "\n".join(f"{i:6d}\tdef parse_{i}_{k}(record):  value_{i} = record.split(',')[{i % 7}]" for i in range(1, 4 * n))
    if name == "Grep":
        return "\n".join(f"src/mod{i % 9}.py:{10 * i + k}:def parse_{i % 5}(line, sep=',', strict={i % 2 == 0}):" for i in range(2 * n))
    if name == "Edit":
        return (f"The file /repo/src/mod{k % 9}.py has been updated. Here's the result of running `cat -n` on a snippet:\n"
                + "\n".join(f"{i:6d}\t    fields = line.split(sep)  # edited at step {k}" for i in range(n)))
    return ("============================= test session starts ==============================\n"
            + "\n".join(f"tests/test_mod{k % 9}.py::test_case_{i} {'FAILED' if i % 11 == 3 else 'PASSED'}" for i in range(3 * n))
            + f"\n=== {3 * n - (3 * n + 7) // 11} passed, {(3 * n + 7) // 11} failed in 0.{k:02d}s ===")


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """The scripted model's answer to ``body`` (module docstring), as a Messages API object."""
    k = _step(body)
    blocks: list[dict[str, Any]] = []
    if k % 3 == 0:
        blocks.append({"type": "thinking", "thinking": f"Step {k}: what did the last output say?", "signature": sign(f"Step {k}: what did the last output say?")})
    if k == TEXT_STEP:
        blocks.append({"type": "text", "text": f"The parser is fixed and the tests pass (hgs{k}_)."})
        stop = "end_turn"
    else:
        name, args = tool_input(k)
        blocks += [{"type": "text", "text": f"Next I run {name} (step {k})."},
                   {"type": "tool_use", "id": f"toolu_hgs{k}_{name.lower()}", "name": name, "input": args}]
        stop = "tool_use"
    return {"id": f"msg_{k}", "type": "message", "role": "assistant", "model": body.get("model"), "content": blocks,
            "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}


def sse(message: dict[str, Any]) -> list[str]:
    """``message`` as the Messages API streams it (docs.anthropic.com/en/docs/build-with-claude/streaming):
    ``message_start`` (with the usage), each block's start, deltas (text, thinking and signature, the
    tool input's JSON in pieces) and stop, ``message_delta``, ``message_stop``."""
    def ev(kind: str, **data: Any) -> str:
        return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"

    out = [ev("message_start", message={**message, "content": [], "stop_reason": None})]
    for i, b in enumerate(message["content"]):
        if b["type"] == "thinking":
            out += [ev("content_block_start", index=i, content_block={"type": "thinking", "thinking": ""}),
                    ev("content_block_delta", index=i, delta={"type": "thinking_delta", "thinking": b["thinking"]}),
                    ev("content_block_delta", index=i, delta={"type": "signature_delta", "signature": b["signature"]})]
        elif b["type"] == "tool_use":
            args = json.dumps(b["input"])
            out += [ev("content_block_start", index=i, content_block={**b, "input": {}})]
            out += [ev("content_block_delta", index=i, delta={"type": "input_json_delta", "partial_json": args[j:j + 9]})
                    for j in range(0, len(args), 9)]
        else:
            out += [ev("content_block_start", index=i, content_block={"type": "text", "text": ""})]
            out += [ev("content_block_delta", index=i, delta={"type": "text_delta", "text": b["text"][j:j + 7]})
                    for j in range(0, len(b["text"]), 7)]
        out.append(ev("content_block_stop", index=i))
    return out + [ev("message_delta", delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
                     usage={"output_tokens": 1}), ev("message_stop")]


def assembled(stream: str) -> dict[str, Any]:
    """The message a client makes of a Messages API stream (as Claude Code does): its blocks, the
    tool inputs parsed from their JSON pieces, and the usage of ``message_start``."""
    message: dict[str, Any] = {}
    pieces: dict[int, str] = {}
    for chunk in stream.split("\n\n"):
        data = next((line[6:] for line in chunk.splitlines() if line.startswith("data: ")), None)
        if data is None:
            continue
        e = json.loads(data)
        if e["type"] == "message_start":
            message = e["message"]
        elif e["type"] == "content_block_start":
            message["content"].append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta":
            b, d = message["content"][e["index"]], e["delta"]
            if d["type"] == "input_json_delta":
                pieces[e["index"]] = pieces.get(e["index"], "") + d["partial_json"]
            else:
                field = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}[d["type"]]
                b[field] = b.get(field, "") + d[field]
        elif e["type"] == "content_block_stop" and e["index"] in pieces:
            message["content"][e["index"]]["input"] = json.loads(pieces[e["index"]])
    return message


def provider() -> tuple[FastAPI, list[dict[str, Any]]]:
    """The provider: refuses what Anthropic would (``anthropic_violation``), answers with
    :func:`answer` (streamed when asked, :func:`sse`) and the usage its simulated cache gives
    (``tests/fake_cache.py``); the list receives every request body it accepted."""
    app, seen, caches = FastAPI(), [], fake_cache.PromptCaches()

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        body = await request.json()
        if (why := anthropic_violation(body) or beta_violation(body, request.headers)) is not None:
            return JSONResponse({"type": "error", "error": {"type": "invalid_request_error", "message": why}}, 400)
        seen.append(body)
        usage = caches.usage("anthropic", body)
        if body.get("stream"):
            return StreamingResponse(iter(fake_cache.with_usage(sse(answer(body)), usage)), media_type="text/event-stream")
        return fake_cache.with_usage(answer(body), usage)

    return app, seen


MESSAGE_MARK = CC  # the breakpoint on the last two messages (a test may give it the hour)


def _marked(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return content[:-1] + [{**content[-1], "cache_control": MESSAGE_MARK}]


def request(history: list[dict[str, Any]], stream: bool = False) -> dict[str, Any]:
    """Claude Code's request for ``history`` (its own copy, unmarked): the last two messages'
    last blocks carry a breakpoint."""
    msgs = [dict(m, content=_marked(m["content"])) if i >= len(history) - 2 else m for i, m in enumerate(history)]
    return {"model": "claude-sonnet-4-5", "max_tokens": 32000, "system": SYSTEM, "tools": TOOLS, "messages": msgs, "stream": stream}


def run(clients: list[Any], calls: int, headers: dict[str, str], stream: bool = False) -> list[dict[str, Any]]:
    """``calls`` calls of one session, the i-th sent through ``clients[i % len(clients)]`` (each an
    ``httpx.AsyncClient`` on a proxy or on the provider itself), streamed with ``stream`` (as Claude
    Code asks, the answer assembled by :func:`assembled`); returns each answer's ``usage``."""
    history: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nThis is a git repository; the tests are in tests/.\n</system-reminder>"},
        {"type": "text", "text": TASK}]}]
    usages = []

    async def go() -> None:
        for i in range(calls):
            r = await clients[i % len(clients)].post("/v1/messages", json=request(history, stream), headers=headers)
            assert r.status_code == 200, r.text
            data = assembled(r.text) if stream else r.json()
            usages.append(data["usage"])
            history.append({"role": "assistant", "content": data["content"]})
            use = next((b for b in data["content"] if b["type"] == "tool_use"), None)
            if use is None:
                history.append({"role": "user", "content": [{"type": "text", "text": FOLLOW_UP}]})
                continue
            k = int(MARK.search(use["id"]).group(1))
            turn = [{"type": "tool_result", "tool_use_id": use["id"], "content": tool_output(k, use["name"])}]
            if k % 7 == 0:
                turn.append({"type": "text", "text": "<system-reminder>\nThe todo list changed: 2 of 3 items done.\n</system-reminder>"})
            history.append({"role": "user", "content": turn})

    asyncio.run(go())
    return usages


def bill(usages: list[dict[str, Any]]) -> float:
    """Input tokens priced as Anthropic bills them, in units of one fresh input token: fresh 1,
    cache writes 1.25 (2 for those written with the 1-hour TTL), cache reads 0.1 (module docstring)."""
    return sum(u["input_tokens"] + 1.25 * u["cache_creation_input_tokens"] + 0.75 * u.get("cache_creation", {}).get("ephemeral_1h_input_tokens", 0)
               + 0.1 * u["cache_read_input_tokens"] for u in usages)


def asgi_client(app: Any, base: str = "http://proxy") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base, timeout=60)
