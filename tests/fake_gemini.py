"""The fake provider's Gemini API (``POST /v1beta/models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse``, ``GET /v1beta/models``), added to the fake of
``tests/fake_upstream.py`` by :func:`add_routes`. A test double: it lives with the tests.

It enforces the request rules of Google's Gemini API reference and its "Function calling" guide
(:func:`gemini_violation`) and answers a violation with 400 in Google's error shape
``{"error": {"code": 400, "message", "status": "INVALID_ARGUMENT"}}``, recorded at
``GET /_rejections``:

* ``contents`` is a non-empty list of ``Content`` objects whose ``role`` is ``user`` or ``model``
  (or left out) and whose ``parts`` is a non-empty list; each part holds exactly one data field;
* a model turn with ``functionCall`` parts is followed directly by a user turn holding one
  ``functionResponse`` per call, with the same names ("Please ensure that the number of function
  response parts is equal to the number of function call parts of the function call turn."), and
  a ``functionResponse`` part answers such a turn; its ``response`` is an object;
* a ``functionCall`` part's ``thoughtSignature`` is the one the fake made (:func:`signature`): a
  call sent back with a modified or foreign signature is rejected, as Gemini rejects a turn whose
  signature does not belong to it;
* an ``inlineData`` part names its ``mimeType`` and holds base64 ``data``.

Answers (request count ``n``): when ``tools`` declare functions and the last turn is the user's
own (no function responses), a call of ``list_directory`` when declared (its required string
parameters set to ``"."``; Gemini CLI's tool), else of the first function with ``{"q": "<n>"}``,
carrying the fake's ``thoughtSignature``; otherwise the text ``answer <n>`` (streamed in two
pieces); a thought summary ``thinking <n>`` first when ``generationConfig.thinkingConfig`` asks
for thoughts (``includeThoughts``); or, when ``generationConfig.responseMimeType`` asks for JSON, an object saying the user
speaks next (what Gemini CLI's next-speaker check reads). A model named ``script-<N>`` gets the
scripted answers of ``tests/fake_scripts.py`` (the ``clients`` tests). Usage: ``promptTokenCount`` 3, 1 of
them cached; model ``error-model`` gets 429 ``RESOURCE_EXHAUSTED``.

Models named ``recall-…`` use the proxy's recall tool (:func:`recall_parts`): while
``historygraph_recall`` is declared, the contents' placeholders name ids and no call of it was
answered, they call it with those ids (``recall-bad-model``: with ``{"path": "x"}``, arguments the
tool does not take; ``recall-late-model``: after the text ``Let me check. `` in the same turn;
``recall-both-model``: after a call of the first declared function, ``{"path": "again"}``);
once the last turn answers it, the text ``recalled <N>: <first 8 characters>`` of that answer's
``output`` (N its length).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

import re

import fake_scripts

DATA = ("text", "inlineData", "functionCall", "functionResponse", "fileData", "executableCode", "codeExecutionResult")
USAGE = {"promptTokenCount": 3, "cachedContentTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 4}
COUNT_RULE = ("Please ensure that the number of function response parts is equal to the number of function call parts "
              "of the function call turn.")


def signature(call: dict[str, Any]) -> str:
    """The fake's ``thoughtSignature`` of a function call (name and args)."""
    text = json.dumps([call.get("name"), call.get("args") or {}], sort_keys=True)
    return base64.b64encode(b"sig:" + hashlib.sha256(text.encode()).digest()[:12]).decode()


def _part_violation(p: Any, where: str) -> str | None:
    if not isinstance(p, dict):
        return f"{where}: a part must be an object"
    held = [f for f in DATA if f in p]
    if len(held) != 1:
        return f"{where}: a part must hold exactly one data field, it holds {held}"
    if "inlineData" in p:
        d = p["inlineData"]
        if not isinstance(d, dict) or not isinstance(d.get("mimeType"), str):
            return f"{where}.inlineData: mimeType required"
        try:
            base64.b64decode(d.get("data") or "", validate=True)
        except (binascii.Error, ValueError):
            return f"{where}.inlineData.data: not base64"
    if "functionCall" in p and "thoughtSignature" in p and p["thoughtSignature"] != signature(p["functionCall"]):
        return f"{where}: thoughtSignature does not belong to this function call"
    if "functionResponse" in p and not isinstance(p["functionResponse"].get("response", {}), dict):
        return f"{where}.functionResponse.response must be an object"
    return None


def gemini_violation(body: dict[str, Any]) -> str | None:
    """The first rule of the module docstring ``body`` breaks, or ``None``."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "contents is not specified"
    calls: list[str] = []
    for i, c in enumerate(contents):
        if not isinstance(c, dict):
            return f"contents[{i}]: not an object"
        role = c.get("role") or "user"
        if role not in ("user", "model"):
            return f"contents[{i}].role: Please use a valid role: user, model."
        parts = c.get("parts")
        if not isinstance(parts, list) or not parts:
            return f"contents[{i}].parts: contents.parts must not be empty."
        for j, p in enumerate(parts):
            if (why := _part_violation(p, f"contents[{i}].parts[{j}]")) is not None:
                return why
        answers = sorted(p["functionResponse"].get("name") for p in parts if "functionResponse" in p)
        if calls or answers:
            if role != "user" or sorted(calls) != answers:
                return f"contents[{i}]: {COUNT_RULE} (calls {sorted(calls)}, responses {answers})"
        calls = [p["functionCall"].get("name") for p in parts if "functionCall" in p] if role == "model" else []
    return None


def _declared(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for t in body.get("tools") or [] if isinstance(t, dict) for f in t.get("functionDeclarations") or []]


def scripted_parts(body: dict[str, Any], model: str, n: int) -> list[dict[str, Any]]:
    """The answer of a scripted model ``script-<N>`` (``tests/fake_scripts.py``: the client's shell
    tool runs step ``k``'s command, then a text), read from the request as the other APIs' are."""
    shim = {"model": model,
            "tools": [{"name": f["name"], "parameters": f.get("parameters") or f.get("parametersJsonSchema") or {}} for f in _declared(body)],
            "messages": [{"role": "assistant", "content": json.dumps(c)} for c in body["contents"] if c.get("role") == "model"]}
    act = fake_scripts.action(shim, n)
    if act.get("call"):
        call = {"name": act["call"]["name"], "args": act["call"]["args"]}
        return [{"functionCall": call, "thoughtSignature": signature(call)}]
    return [{"text": act["text"]}]


RECALL = "historygraph_recall"
PLACEHOLDER = re.compile(r"\[tool result (\S+) omitted from this context")


def recall_parts(body: dict[str, Any], model: str) -> list[dict[str, Any]] | None:
    """A ``recall-…`` model's answer (module docstring); ``None``: the fake's usual answer."""
    answered = [p["functionResponse"] for p in body["contents"][-1].get("parts") or []
                if "functionResponse" in p and p["functionResponse"].get("name") == RECALL]
    if answered:
        out = str((answered[-1].get("response") or {}).get("output"))
        return [{"text": f"recalled {len(out)}: {out[:8]}"}]
    ids = PLACEHOLDER.findall(json.dumps(body["contents"]))
    if not ids or RECALL not in [f.get("name") for f in _declared(body)]:
        return None
    call = {"name": RECALL, "args": {"path": "x"} if model == "recall-bad-model" else {"ids": ids}}
    late = [{"text": "Let me check. "}] if model == "recall-late-model" else []
    if model == "recall-both-model":
        own = {"name": _declared(body)[0]["name"], "args": {"path": "again"}}
        late = [{"functionCall": own, "thoughtSignature": signature(own)}]
    return [*late, {"functionCall": call, "thoughtSignature": signature(call)}]


def answer_parts(body: dict[str, Any], model: str, n: int) -> list[dict[str, Any]]:
    """The model turn's parts the fake answers with (module docstring)."""
    last = body["contents"][-1]
    declared = _declared(body)
    thinking = (body.get("generationConfig") or {}).get("thinkingConfig") or {}
    thought = [{"text": f"thinking {n}", "thought": True}] if thinking.get("includeThoughts") else []
    if ((body.get("generationConfig") or {}).get("responseMimeType") or "") == "application/json":
        return [{"text": json.dumps({"reasoning": "fake", "next_speaker": "user"})}]
    if model.startswith("recall-") and (recalling := recall_parts(body, model)) is not None:
        return [*thought, *recalling]
    if fake_scripts.script_of(model):
        return [*thought, *scripted_parts(body, model, n)]
    if declared and not any("functionResponse" in p for p in last.get("parts") or []):
        fn = next((f for f in declared if f.get("name") == "list_directory"), None)
        if fn is not None:
            schema = fn.get("parameters") or fn.get("parametersJsonSchema") or {}
            args: dict[str, Any] = {k: "." for k in schema.get("required") or []}
        else:
            fn, args = declared[0], {"q": str(n)}
        call = {"name": fn["name"], "args": args}
        return [*thought, {"functionCall": call, "thoughtSignature": signature(call)}]
    return [*thought, {"text": f"answer {n}"}]


def _response(parts: list[dict[str, Any]], model: str, n: int, finish: str | None = "STOP") -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": USAGE, "modelVersion": model, "responseId": f"resp-{n}"}


def add_routes(app: FastAPI, record: Callable[[Request], Any], rejected: list[dict[str, Any]], seen: list[Any],
               paced: Callable[..., Any]) -> None:
    """The Gemini routes on the fake ``app`` (``record`` keeps the request; ``paced`` streams)."""

    @app.get("/v1beta/models")
    async def models() -> dict[str, Any]:
        return {"models": [{"name": "models/fake-gemini", "displayName": "Fake", "supportedGenerationMethods": ["generateContent"]}]}

    @app.post("/v1beta/models/{target}")
    async def generate(target: str, request: Request) -> Any:
        body = await record(request)
        seen[-1]["query"] = request.url.query
        model, _, method = target.rpartition(":")
        if (why := gemini_violation(body)) is not None:
            rejected.append({"path": request.url.path, "error": why, "body": body})
            return JSONResponse({"error": {"code": 400, "message": why, "status": "INVALID_ARGUMENT"}}, 400)
        if model == "error-model":
            return JSONResponse({"error": {"code": 429, "message": "fake upstream: quota", "status": "RESOURCE_EXHAUSTED"}}, 429)
        n = len(seen)
        parts = answer_parts(body, model, n)
        if method == "generateContent":
            return _response(parts, model, n)
        text = parts[-1].get("text")
        pieces = [*parts[:-1], {"text": text[:len(text) // 2]}, {"text": text[len(text) // 2:]}] if text else parts  # a call whole
        events = [_response([p], model, n, None) for p in pieces[:-1]] + [_response(pieces[-1:], model, n)]
        lines = ["data: " + json.dumps(e) + "\r\n\r\n" for e in events]
        return StreamingResponse(paced(lines, {"model": model}), media_type="text/event-stream")
