"""The recall tool's Gemini API forms (:mod:`historygraph.server.recall_tool` runs the rounds).

Source: Google's Gemini API reference ("Generating content": ``tools[].functionDeclarations``,
``FunctionDeclaration.parametersJsonSchema``; ``GenerateContentResponse`` chunks of
``streamGenerateContent?alt=sse``) and the "Function calling" guide: the model's turn (its
``Content``, sent back whole: thought signatures with the parts they came in) is followed by one
user turn with one ``functionResponse`` per ``functionCall``, same name (and ``id`` when the call
has one), ``response`` an object (``{"output": text}``).

The tool is offered as a declaration added to the request's first tool holding
``functionDeclarations`` (a tool of its own when none does). A streamed round's chunks are split
into one chunk per part (:func:`split`), so that each event starts one thing (:func:`starts`) and a
recall call made after the answer began is cut out of the stream at its part; chunk boundaries
carry no meaning in the API (clients join the parts of all chunks).
"""

from __future__ import annotations

import json
from typing import Any

from historygraph.providers import gemini as gem
from historygraph.render.recall import DESCRIPTION, PARAMETERS, TOOL_NAME

DECLARATION = {"name": TOOL_NAME, "description": DESCRIPTION, "parametersJsonSchema": PARAMETERS}


def _declarations(tool: Any) -> list[Any] | None:
    decls = tool.get("functionDeclarations") if isinstance(tool, dict) else None
    return decls if isinstance(decls, list) else None


def with_tool(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the recall function declared."""
    tools = list(body.get("tools") or [])
    k = next((i for i, t in enumerate(tools) if _declarations(t) is not None), None)
    if k is None:
        tools.append({"functionDeclarations": [DECLARATION]})
    else:
        tools[k] = {**tools[k], "functionDeclarations": [*(_declarations(tools[k]) or []), DECLARATION]}
    return {**body, "tools": tools}


def without_tool(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the recall function (a tool left with no declaration and nothing else is
    dropped; with no tool left, ``tools`` and ``toolConfig`` go)."""
    tools = []
    for t in body.get("tools") or []:
        decls = _declarations(t)
        if decls is not None:
            kept = [d for d in decls if not (isinstance(d, dict) and d.get("name") == TOOL_NAME)]
            if len(kept) != len(decls):
                t = {**t, "functionDeclarations": kept} if kept else {k: v for k, v in t.items() if k != "functionDeclarations"}
                if not t:
                    continue
        tools.append(t)
    out = {k: v for k, v in body.items() if k != "tools"}
    return {**out, "tools": tools} if tools else {k: v for k, v in out.items() if k != "toolConfig"}


def turn_of(data: Any) -> Any:
    """The model's turn (candidate 0's ``Content``) of a non-streamed answer."""
    candidates = data.get("candidates") if isinstance(data, dict) else None
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    return first.get("content") if isinstance(first, dict) else None


def streamed_turn(events: list[Any]) -> dict[str, Any]:
    """The model's turn of a streamed round, its parts joined as a client joins them."""
    acc = gem.StreamAccumulator()
    for e in events:
        acc.feed(e)
    return {"role": "model", "parts": acc.parts}


def exchange(turn: dict[str, Any], texts: list[str]) -> list[Any]:
    """The model's ``turn`` and the user turn answering its calls in order, ``texts`` the answers."""
    calls = [p["functionCall"] for p in turn.get("parts") or [] if isinstance(p, dict) and "functionCall" in p]
    answers = [{"functionResponse": {"name": c.get("name"), **({"id": c["id"]} if c.get("id") else {}), "response": {"output": t}}}
               for c, t in zip(calls, texts)]
    return [turn, {"role": "user", "parts": answers}]


def _parts(event: Any) -> list[Any] | None:
    content = turn_of(event)
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else None


def split(event: Any) -> list[Any]:
    """``event`` as one chunk per part of candidate 0, the last holding the chunk's other fields
    (``finishReason``, usage); a chunk with at most one part as it is."""
    parts = _parts(event)
    if parts is None or len(parts) < 2:
        return [event]
    cand = event["candidates"][0]
    one = {k: v for k, v in cand.items() if k not in ("finishReason", "content")}
    content = cand["content"]
    return [*({**event, "candidates": [{**one, "content": {**content, "parts": [p]}}]} for p in parts[:-1]),
            {**event, "candidates": [{**cand, "content": {**content, "parts": parts[-1:]}}, *event["candidates"][1:]]}]


def starts(event: Any) -> str | None:
    """What a (split) chunk starts: ``"recall"``, ``"output"`` or ``None`` (thoughts, empty text,
    bookkeeping)."""
    for p in _parts(event) or ():
        if not isinstance(p, dict) or p.get("thought") or p.get("text") == "":
            continue
        call = p.get("functionCall")
        return "recall" if isinstance(call, dict) and call.get("name") == TOOL_NAME else "output"
    return None


def thought(event: Any) -> bool:
    """Whether a (split) chunk holds a thought summary (dropped from a round that continues an answer)."""
    return any(isinstance(p, dict) and p.get("thought") for p in _parts(event) or ())


def relayed(event: Any) -> bytes:
    return ("data: " + json.dumps(event, ensure_ascii=False) + "\n\n").encode()
