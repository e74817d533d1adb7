"""Clients that restate their tool calls as text: smolagents' ``ToolCallingAgent``.

smolagents (``ToolCallingAgent`` with ``OpenAIServerModel``, 1.26) sends ``tools`` and receives
the model's ``tool_calls`` as any Chat Completions client does, but keeps its memory as text and
rebuilds every request from it: the answer that called a tool comes back as an assistant message
whose text is the model's own text (stripped, on a line of its own, when it wrote any) followed by

    Calling tools:
    [{'id': 'call_1', 'type': 'function', 'function': {'name': 'lookup', 'arguments': {'key': 'k1'}}}]

(Python's ``str`` of the list of calls, their arguments parsed), and the tool's output as the
user message after it (``Observation:\\n…``; an error as ``Call id: …\\nError:\\n…``), content as
lists of text parts. Compared as sent, that echo never equals the answer the proxy stored (an
assistant message with ``tool_calls``), so every request of a run looked like a new chat whose
client curates its own context: 25 sessions for 25 requests and B never applied (issue 50).

:func:`read` reads such a request the way the model's answers were: each echo of **one** call
becomes the assistant message with that call (what the proxy stored as the answer, so the request
continues its session), and the user message after it the call's tool result (so B places
placeholders on old outputs as for any tool loop). Positions do not move: one request message,
one event. What is forwarded keeps the client's representation: a message rendered unchanged is
the client's JSON, and one rendered anew (a placeholder for an old output, a brief view) is put
back in the client's form by :func:`client_form`. The echo's framing (``Calling tools:``, the ids,
the list's syntax) is text the canonical events are not charged for; :attr:`TextCalls.framing`
counts it, and the proxy renders under B less that count, so what it forwards stays within B.

An echo of several calls is left as text: smolagents sends their outputs as one user message,
which is no result of any one call (such a step continues as a branch, docs/proxy.md).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from historygraph.history.events import EventError, Message, ToolCall
from historygraph.providers import jsonio

CALLING = "Calling tools:\n"
"""What smolagents writes before the list of an answer's calls (``ActionStep.to_messages``)."""
_ECHO = re.compile(r"(?s)\A(?:(?P<text>.*?)\n)?Calling tools:\n(?P<calls>\[.*\])\s*\Z")
_NEEDLE = b"Calling tools:"  # as it appears in the JSON bytes (the newline after it is escaped there)


@dataclass
class TextCalls:
    """What :func:`read` found in one request.

    Attributes:
        events: request position -> the event it stands for (an assistant message with its one
            call; the user message after it as that call's tool result).
        calls: call id -> the client's text of the list holding it (what follows ``Calling tools:``).
        framing: tokens of the echoes' text beyond what their events are charged (never negative).
    """

    events: dict[int, Message] = field(default_factory=dict)
    calls: dict[str, str] = field(default_factory=dict)
    framing: int = 0


def _call(text: str) -> tuple[str, ToolCall] | None:
    """``(the model's text, its call)`` when ``text`` is an echo of exactly one call, else ``None``."""
    m = _ECHO.match(text)
    if m is None:
        return None
    try:
        calls = ast.literal_eval(m.group("calls"))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not (isinstance(calls, list) and len(calls) == 1 and isinstance(calls[0], dict)):
        return None
    call, fn = calls[0], calls[0].get("function")
    if not (isinstance(call.get("id"), str) and call["id"] and isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
        return None
    args = fn.get("arguments")
    try:
        arguments = args if isinstance(args, str) else json.dumps({} if args is None else args, ensure_ascii=False)
    except (TypeError, ValueError):  # a Python value JSON cannot carry
        return None
    return m.group("text") or "", ToolCall(call["id"], fn["name"], arguments)


def read(raw: Sequence[Any], count: Callable[[Message], int]) -> TextCalls | None:
    """The echoes of one call in a Chat Completions request's ``messages`` (``raw``: the client's
    JSON objects, or their unparsed bytes) with the user message after each, read as the call
    and its result (module docstring); ``count``: the token counter's ``count_message``, for
    :attr:`TextCalls.framing`. ``None`` when there are none (the request is read as sent).
    Raises nothing: a message that is not such an echo is left to the request's own parsing."""
    found = TextCalls()
    for i in range(len(raw) - 1):
        item = raw[i]
        if isinstance(item, jsonio.Raw) and _NEEDLE not in bytes(item) or isinstance(item, dict) and item.get("role") != "assistant":
            continue
        try:
            msg, nxt = Message.from_openai(jsonio.item(item, True)), Message.from_openai(jsonio.item(raw[i + 1], True))
        except (EventError, ValueError, TypeError):
            continue
        echo = _call(msg.content) if msg.role == "assistant" and not msg.tool_calls and not msg.media else None
        if echo is None or nxt.role != "user" or echo[1].id in found.calls:
            continue
        text, call = echo
        found.events[i] = Message("assistant", text, (call,))
        found.events[i + 1] = Message("tool", nxt.content, tool_call_id=call.id, media=nxt.media)
        found.calls[call.id] = msg.content[msg.content.index(CALLING) + len(CALLING):].rstrip()
        found.framing += max(0, count(msg) - count(found.events[i]))
    return found if found.events else None


def client_form(message: Message, calls: TextCalls) -> dict[str, Any] | None:
    """``message`` (rendered anew: a placeholder, an excerpt, a brief view) in the client's text
    form when it stands for one of ``calls``' echoes: a tool result as the user message it came
    as, an assistant message as its text and ``Calling tools:`` with the client's list; else
    ``None`` (sent in the API's own form)."""
    if message.role == "tool" and message.tool_call_id in calls.calls:
        return {"role": "user", "content": message.content}
    if message.role == "assistant" and message.tool_calls and all(c.id in calls.calls for c in message.tool_calls):
        listed = calls.calls[message.tool_calls[0].id]
        return {"role": "assistant", "content": (message.content + "\n" if message.content else "") + CALLING + listed}
    return None
