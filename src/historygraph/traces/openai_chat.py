"""Reader for plain OpenAI chat transcripts: historygraph's own example format.

A JSON object ``{"format": "openai-chat", "trace_id"?, "messages": [...]}`` or a bare JSON list of
chat messages (each with a ``role``). Messages use the OpenAI fields ``role``, ``content``,
``tool_calls``, ``tool_call_id`` and ``name``; anything else is ignored. This is the format of the
example trace shipped in ``historygraph/examples`` and what a user's own logs of the Chat
Completions API look like.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from historygraph.history.events import Trace

from historygraph.traces._common import Builder, TraceFormatError, load_json, openai_message, req

NAME = "openai-chat"


def sniff(obj: Any) -> bool:
    """``{"format": "openai-chat", ...}``, or a list whose first item is a message with a role."""
    if isinstance(obj, dict):
        return obj.get("format") == NAME
    return isinstance(obj, list) and bool(obj) and isinstance(obj[0], dict) and "role" in obj[0] and "traj" not in obj[0]


def read(path: str | Path, obj: Any = None) -> Iterator[Trace]:
    if obj is None:
        obj = load_json(path, NAME)
    if isinstance(obj, dict):
        messages = req(obj, "messages", list, "", path=path, fmt=NAME)
        trace_id = str(obj.get("trace_id") or Path(path).stem)
    elif isinstance(obj, list):
        messages, trace_id = obj, Path(path).stem
    else:
        raise TraceFormatError(path, NAME, "(top level)", f"expected an object or a list, got {type(obj).__name__}")
    b = Builder(path, NAME, trace_id)
    for i, m in enumerate(messages):
        b.add(openai_message(b, m, f"messages[{i}]"))
    msgs, stats = b.finish()
    meta = {"description": obj.get("description")} if isinstance(obj, dict) and obj.get("description") else {}
    yield Trace(source=NAME, trace_id=trace_id, path=str(path), messages=msgs, meta={**meta, **stats})
