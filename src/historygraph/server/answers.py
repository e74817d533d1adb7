"""Reading an upstream's non-streamed answer: its JSON and its assistant message, and what to say
when it cannot be read (the proxy's forward and the recall tool's rounds)."""

from __future__ import annotations

import json
from typing import Any, Callable

from historygraph.history.events import Message
from historygraph.providers import anthropic as anth
from historygraph.providers import jsonio
from historygraph.server.upstream import OpenAIStreamAccumulator


UNREADABLE = (ValueError, TypeError, KeyError, AttributeError, IndexError)
"""What reading an upstream's answer raises when the answer is malformed (``json.JSONDecodeError``
and :class:`EventError` are both ``ValueError`` subclasses)."""


def unreadable(exc: BaseException) -> str:
    """What an upstream did whose answer raised ``exc`` when read."""
    if isinstance(exc, json.JSONDecodeError):
        return f"it ended its answer with a tool call whose input is not complete JSON ({exc})"
    return f"its answer cannot be read ({type(exc).__name__}: {exc})"


def json_or_none(content: bytes) -> Any:
    """A non-streamed answer's JSON, parsed once for its usage and its message (``None``: not JSON)."""
    try:
        return jsonio.loads(content)[0]
    except ValueError:
        return None


def answer_of(data: Any, accumulator: Callable[[], Any]) -> Message | None:
    """The assistant message of a non-streamed response's JSON (``None`` when it has none;
    ``data`` may also be the response's bytes)."""
    try:
        if isinstance(data, (bytes, str)):
            data = jsonio.loads(data)[0]
        if hasattr(accumulator, "answer_of"):
            return accumulator.answer_of(data)
        if accumulator is OpenAIStreamAccumulator:
            return Message.from_openai({**data["choices"][0]["message"], "role": "assistant"})
        return anth.answer_message(data)
    except UNREADABLE:
        return None


