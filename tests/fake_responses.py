"""The fake provider's OpenAI Responses API (``POST /v1/responses``, streamed and not), added to the
fake of ``tests/fake_upstream.py`` by :func:`add_routes`. A test double: it lives with the tests.

It enforces the request rules of the Responses API reference (:func:`responses_violation`) and
answers a violation with 400 in OpenAI's error shape, recorded at ``GET /_rejections``:

* ``input`` is a string or a list of objects; item ids are unique;
* a ``function_call_output`` (``custom_tool_call_output``) answers a ``function_call``
  (``custom_tool_call``) with its ``call_id`` earlier in the input ("No tool call found for
  function call output with call_id …"), unless the request continues ``previous_response_id``;
* every call is answered by its output before the next ``message`` item, unless no message
  follows it ("No tool output found for function call …");
* a ``reasoning`` item is followed by the item it came with (not by a user/system message, not
  last) and its ``encrypted_content`` is the one the fake made (:func:`seal`, checkable as
  ``sign()`` is for Anthropic thinking): a modified reasoning item is rejected;
* assistant ``message`` content parts are ``output_text``/``refusal``, user/system/developer
  parts ``input_*`` ("Invalid value: 'input_text'. Supported values are: 'output_text' and 'refusal'.");
  an ``input_image`` names its image, an ``input_file`` its file (:func:`_media_violation`).

Answers (request count ``n``): a ``reasoning`` item (summary ``thinking <n>``, sealed), then, when
``tools`` are offered and the last input item is the user's, a call of the first tool
(``function_call`` with arguments ``{"q": "<n>"}``, or for a ``custom`` tool a ``custom_tool_call``
with input ``q <n>``; call id ``call_<n>``), else a message ``answer <n>``. Usage: 3 input tokens,
2 of them cached, 1 output token. A model named ``script-<N>`` gets the scripted output items of
``tests/fake_scripts.py`` instead (a real agent program's ``N`` steps; the ``clients`` tests),
streamed with the same events.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

import fake_scripts
from fake_upstream import faulty, sign

CALLS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
OUTPUTS = {v: k for k, v in CALLS.items()}
USAGE = {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 1,
         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 4}


def seal(text: str) -> str:
    """The fake's ``encrypted_content`` of a reasoning summary text."""
    return f"enc:{sign(text)}:{text}"


def _kind(item: dict[str, Any]) -> str:
    return item.get("type") or ("message" if "role" in item else "")


def _reasoning_violation(items: list[dict[str, Any]], i: int) -> str | None:
    item = items[i]
    enc = item.get("encrypted_content")
    if enc is not None:
        text = "\n".join(s.get("text", "") for s in item.get("summary") or [])
        if enc != seal(text):
            return f"input[{i}]: the encrypted content of reasoning item {item.get('id')} could not be verified"
    nxt = items[i + 1] if i + 1 < len(items) else None
    if nxt is None or (_kind(nxt) == "message" and nxt.get("role") != "assistant"):
        return f"input[{i}]: Item '{item.get('id')}' of type 'reasoning' was provided without its required following item."
    return None


def _message_violation(item: dict[str, Any], i: int) -> str | None:
    parts = item.get("content")
    if not isinstance(parts, list):
        return None
    allowed = ("output_text", "refusal") if item.get("role") == "assistant" else ("input_text", "input_image", "input_file")
    for j, p in enumerate(parts):
        if isinstance(p, dict) and p.get("type") not in allowed:
            return (f"input[{i}].content[{j}]: Invalid value: '{p.get('type')}'. Supported values are: "
                    + " and ".join(f"'{a}'" for a in allowed) + ".")
        if (why := _media_violation(p, f"input[{i}].content[{j}]")) is not None:
            return why
    return None


def _media_violation(p: Any, where: str) -> str | None:
    """An ``input_image`` needs ``image_url`` or ``file_id``, an ``input_file`` ``file_data``,
    ``file_id`` or ``file_url`` (the reference's ``ResponseInputImage``, ``ResponseInputFile``)."""
    if not isinstance(p, dict):
        return None
    if p.get("type") == "input_image" and not (isinstance(p.get("image_url"), str) or isinstance(p.get("file_id"), str)):
        return f"{where}: an input_image needs image_url or file_id"
    if p.get("type") == "input_file" and not {"file_data", "file_id", "file_url"} & set(p):
        return f"{where}: an input_file needs file_data, file_id or file_url"
    return None


def responses_violation(body: dict[str, Any]) -> str | None:
    """The first Responses API input rule ``body`` breaks, or ``None`` (see the module docstring)."""
    items = body.get("input")
    if isinstance(items, str):
        return None
    if not isinstance(items, list) or not all(isinstance(it, dict) for it in items):
        return "input: a string or a list of objects is required"
    ids = [it["id"] for it in items if isinstance(it.get("id"), str)]
    if len(ids) != len(set(ids)):
        return f"input: Duplicate item found with id {next(x for x in ids if ids.count(x) > 1)}"
    open_calls: dict[str, tuple[str, int]] = {}
    seen_calls: dict[str, str] = {}
    for i, it in enumerate(items):
        kind = _kind(it)
        if kind in CALLS:
            open_calls[it.get("call_id")] = (kind, i)
            seen_calls[it.get("call_id")] = kind
        elif kind in OUTPUTS:
            output = it.get("output")
            for j, p in enumerate(output if isinstance(output, list) else []):
                if (why := _media_violation(p, f"input[{i}].output[{j}]")) is not None:
                    return why
            if seen_calls.get(it.get("call_id")) != OUTPUTS[kind] and body.get("previous_response_id") is None:
                return f"input[{i}]: No tool call found for {kind.replace('_', ' ')} with call_id {it.get('call_id')}."
            open_calls.pop(it.get("call_id"), None)
        elif kind == "message":
            if open_calls:
                call_id, (_, at) = next(iter(open_calls.items()))
                return f"input[{at}]: No tool output found for function call {call_id}."
            if (why := _message_violation(it, i)) is not None:
                return why
        elif kind == "reasoning" and (why := _reasoning_violation(items, i)) is not None:
            return why
    return None


def responses_output(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The output items of the answer to request ``n`` (see the module docstring)."""
    text = f"thinking {n}"
    out: list[dict[str, Any]] = [{"id": f"rs_{n}", "type": "reasoning", "summary": [{"type": "summary_text", "text": text}],
                                  "encrypted_content": seal(text)}]
    items = body.get("input")
    last = items if isinstance(items, str) else (items or [{}])[-1]
    by_user = isinstance(last, str) or (_kind(last) == "message" and last.get("role") == "user")
    tools = body.get("tools") or []
    if tools and by_user and tools[0].get("type") == "custom":
        out.append({"id": f"ctc_{n}", "type": "custom_tool_call", "call_id": f"call_{n}", "name": tools[0]["name"],
                    "input": f"q {n}", "status": "completed"})
    elif tools and by_user:
        out.append({"id": f"fc_{n}", "type": "function_call", "call_id": f"call_{n}", "name": tools[0]["name"],
                    "arguments": json.dumps({"q": str(n)}), "status": "completed"})
    else:
        out.append({"id": f"msg_{n}", "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": f"answer {n}", "annotations": []}]})
    return out


def response_object(body: dict[str, Any], n: int, output: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    return {"id": f"resp_{n}", "object": "response", "created_at": 0, "status": status, "model": body.get("model", "fake-model"),
            "output": output, "parallel_tool_calls": True, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "metadata": {}, "temperature": None, "top_p": None, "usage": USAGE if status == "completed" else None}


def _item_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The events that stream one output item, between its ``output_item.added`` and ``.done``."""
    ref = {"item_id": item["id"], "output_index": index}
    if item["type"] == "reasoning":
        text = item["summary"][0]["text"]
        return [{"type": "response.output_item.added", "output_index": index, "item": {**item, "summary": []}},
                {"type": "response.reasoning_summary_part.added", **ref, "summary_index": 0, "part": {"type": "summary_text", "text": ""}},
                {"type": "response.reasoning_summary_text.delta", **ref, "summary_index": 0, "delta": text},
                {"type": "response.reasoning_summary_text.done", **ref, "summary_index": 0, "text": text},
                {"type": "response.reasoning_summary_part.done", **ref, "summary_index": 0, "part": {"type": "summary_text", "text": text}}]
    if item["type"] == "function_call":
        args = item["arguments"]
        return [{"type": "response.output_item.added", "output_index": index, "item": {**item, "arguments": "", "status": "in_progress"}},
                *[{"type": "response.function_call_arguments.delta", **ref, "delta": args[i:i + 4]} for i in range(0, len(args), 4)],
                {"type": "response.function_call_arguments.done", **ref, "arguments": args}]
    if item["type"] == "custom_tool_call":
        return [{"type": "response.output_item.added", "output_index": index, "item": {**item, "input": "", "status": "in_progress"}},
                {"type": "response.custom_tool_call_input.delta", **ref, "delta": item["input"]},
                {"type": "response.custom_tool_call_input.done", **ref, "input": item["input"]}]
    text = item["content"][0]["text"]
    part = {"type": "output_text", "text": "", "annotations": []}
    return [{"type": "response.output_item.added", "output_index": index, "item": {**item, "content": [], "status": "in_progress"}},
            {"type": "response.content_part.added", **ref, "content_index": 0, "part": part},
            *[{"type": "response.output_text.delta", **ref, "content_index": 0, "delta": d, "logprobs": []} for d in text.split(" ")[:1] + [" " + w for w in text.split(" ")[1:]]],
            {"type": "response.output_text.done", **ref, "content_index": 0, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **ref, "content_index": 0, "part": {**part, "text": text}}]


def response_events(body: dict[str, Any], n: int, output: list[dict[str, Any]]) -> list[str]:
    """The SSE lines of a streamed answer: ``response.created``, ``response.in_progress``, each
    item's events closed by ``response.output_item.done``, then ``response.completed``."""
    started = response_object(body, n, [], "in_progress")
    events: list[dict[str, Any]] = [{"type": "response.created", "response": started},
                                    {"type": "response.in_progress", "response": started}]
    for i, item in enumerate(output):
        events += _item_events(item, i) + [{"type": "response.output_item.done", "output_index": i, "item": item}]
    events.append({"type": "response.completed", "response": response_object(body, n, output)})
    return [f"event: {e['type']}\ndata: " + json.dumps({**e, "sequence_number": k}) + "\n\n" for k, e in enumerate(events)]


def add_routes(app: FastAPI, record: Callable[[Request], Any], rejected: list[dict[str, Any]], seen: list[Any],
               paced: Callable[..., Any], usage: Callable[[str, dict[str, Any], Any], Any]) -> None:
    """``POST /v1/responses`` on the fake ``app`` (``record`` keeps the request; ``paced`` streams;
    ``usage(api, body, reply)``: the reply with the usage of the fake's prompt cache, when it has one)."""

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        body = await record(request)
        if (why := responses_violation(body)) is not None:
            rejected.append({"path": "/v1/responses", "error": why, "body": body})
            return JSONResponse({"error": {"message": why, "type": "invalid_request_error", "param": "input", "code": None}}, 400)
        if body.get("model") == "error-model":
            return JSONResponse({"error": {"message": "fake upstream: rate limit reached", "type": "rate_limit_error",
                                           "param": None, "code": "rate_limited"}}, 429)
        n = len(seen)
        scripted = fake_scripts.script_of(body.get("model"))
        output = fake_scripts.responses_output(body, n) if scripted else responses_output(body, n)
        if (fault := faulty(body, lambda: response_object(body, n, output))) is not None:  # fake_upstream's fault models
            return fault
        if not body.get("stream"):
            return usage("responses", body, response_object(body, n, output))
        return StreamingResponse(paced(usage("responses", body, response_events(body, n, output)), body),
                                 media_type="text/event-stream")

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        body = await record(request)
        return {"input_tokens": len(json.dumps(body.get("messages"))) // 4}
