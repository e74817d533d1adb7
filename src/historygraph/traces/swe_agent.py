"""Reader for SWE-agent / SWE-agent EnIGMA ``.traj`` files.

Layout of the files as recorded by the tool's public runs. A file is ``{environment, trajectory[], history[], info{…},
replay_config?}`` holding one run; the trace id is the file stem.

Read:
    ``history[]`` (the messages the model saw): ``role``, ``content``, ``thought``, ``action``,
    ``is_demo``, ``tool_calls``, ``tool_call_ids``; ``info.exit_status`` and ``environment``
    into ``meta``.
Ignored:
    ``trajectory[]`` (per-step copy of the same actions/observations plus ``state`` and
    ``response``), ``info.model_stats`` (costs/tokens), ``info.submission``, ``info.edited_files*``,
    ``replay_config``, ``message_type`` and ``agent``.

Demonstrations (``is_demo: true``) are prompt, not execution history: their text is appended to
the system message, separated by a blank line (a system message is created if there is none),
and their number is ``meta["demo_messages"]``.

Two history shapes (``meta["history_format"]``):

* ``"tool_calls"`` (newer): assistant ``tool_calls`` in OpenAI form and ``role: tool`` results
  carrying ``tool_call_ids`` (one tool message per id, all with the same text).
* ``"action"`` (v0.x: pydicom and the CTF files): every assistant message with an ``action``
  becomes an assistant message whose content is its ``thought`` (or ``content`` when there is no
  thought) with ONE synthetic call ``{trace_id}-call-{k}`` named ``bash`` with arguments
  ``{"command": action}``; the ``user`` message that follows it (after the first non-demo
  assistant message) is that call's ``role: tool`` result. Other user messages stay user messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from historygraph.history.events import ToolCall, Trace

from historygraph.traces._common import Builder, Draft, TraceFormatError, dumps, load_json, req, text, tool_call

NAME = "swe-agent"


def sniff(obj: Any) -> bool:
    """A JSON object with list-valued ``history`` and ``trajectory``."""
    return isinstance(obj, dict) and isinstance(obj.get("history"), list) and isinstance(obj.get("trajectory"), list)


def read(path: str | Path, obj: Any = None) -> Iterator[Trace]:
    """Yield the one trajectory in ``path`` (``obj``: the already parsed JSON, if at hand)."""
    if obj is None:
        obj = load_json(path, NAME)
    if not isinstance(obj, dict):
        raise TraceFormatError(path, NAME, "(top level)", f"expected an object, got {type(obj).__name__}")
    name = Path(path).name
    trace_id = name[: -len(".traj.json")] if name.endswith(".traj.json") else Path(path).stem
    b = Builder(path, NAME, trace_id)
    history = req(obj, "history", list, "", b)
    newer = any(isinstance(h, dict) and (h.get("role") == "tool" or "tool_calls" in h or "tool_call_ids" in h)
                for h in history)
    demos: list[str] = []
    k = 0
    pending: str | None = None  # older format: the synthetic call waiting for its observation
    seen_assistant = False
    for i, h in enumerate(history):
        where = f"history[{i}]"
        role = req(h, "role", str, where, b)
        content = text(b, h.get("content"), f"{where}.content")
        if h.get("is_demo"):
            demos.append(content)
            continue
        if role == "system":
            b.add(Draft("system", content, where=where))
        elif role == "assistant" and newer:
            calls = h.get("tool_calls") or []
            if not isinstance(calls, list):
                raise b.err(f"{where}.tool_calls", f"expected a list, got {type(calls).__name__}")
            parsed = [tool_call(b, c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
            b.add(Draft("assistant", content, parsed, where=where))
        elif role == "assistant":
            seen_assistant = True
            action = h.get("action")
            if isinstance(action, str) and action.strip():
                k += 1
                pending = f"{trace_id}-call-{k}"
                thought = h.get("thought")
                body = thought if isinstance(thought, str) and thought else content
                b.add(Draft("assistant", body, [ToolCall(pending, "bash", dumps({"command": action}))], where=where))
            else:
                pending = None
                b.add(Draft("assistant", content, where=where))
        elif role == "tool":
            ids = h.get("tool_call_ids") or ([h["tool_call_id"]] if h.get("tool_call_id") else [])
            if not isinstance(ids, list):
                raise b.err(f"{where}.tool_call_ids", f"expected a list, got {type(ids).__name__}")
            if not ids:
                b.orphan(content, where=where)
            for cid in ids:
                b.add(Draft("tool", content, tool_call_id=str(cid), where=where))
        elif role == "user":
            if not newer and seen_assistant and pending is not None:
                b.add(Draft("tool", content, tool_call_id=pending, name="bash", where=where))
                pending = None
            else:
                b.add(Draft("user", content, where=where))
        else:
            raise b.err(f"{where}.role", f"unknown role {role!r}")
    if demos:
        demo_text = "\n\n".join(demos)
        system = next((d for d in b.drafts if d.role == "system"), None)
        if system is None:
            b.drafts.insert(0, Draft("system", demo_text, where="history (demonstrations)"))
        else:
            system.content = f"{system.content}\n\n{demo_text}" if system.content else demo_text
    msgs, stats = b.finish()
    info = got if isinstance(got := obj.get("info"), dict) else {}
    meta = {"environment": obj.get("environment"), "exit_status": info.get("exit_status"),
            "history_format": "tool_calls" if newer else "action", "demo_messages": len(demos), **stats}
    yield Trace(source=NAME, trace_id=trace_id, path=str(path), messages=msgs, meta=meta)
