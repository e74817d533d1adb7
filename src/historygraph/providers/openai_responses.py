"""OpenAI Responses API (``POST /v1/responses``) ⇄ canonical OpenAI-form :class:`~historygraph.history.events.Message`.

Source: the OpenAI API reference, "Responses" (create a response; its ``input`` items and output
items) and "Streaming events"; the item and event shapes are those of the ``openai`` Python
package's ``openai/types/responses`` definitions (``ResponseInputItemParam``, ``ResponseStreamEvent``).

Conversion of a request's ``instructions`` and ``input`` (:func:`to_canonical`):

* ``instructions`` (a string) → one ``system`` message first; it travels on in its own field;
* ``input`` as a string → one ``user`` message;
* a ``message`` item (``type`` may be left out) with role ``user`` → a ``user`` message, role
  ``system``/``developer`` → a ``system`` message; content parts are flattened to text
  (``input_text``; ``input_image``/``input_file`` parts, here and in a tool output's list, are
  stored whole in :attr:`Message.media`, an ``[input_image]`` marker in the text where each was,
  and charged by the provider's estimate, :mod:`historygraph.signals.media`, not by their bytes);
* a ``function_call_output`` / ``custom_tool_call_output`` item → one ``tool`` message
  (``tool_call_id`` = its ``call_id``);
* every other item is the model's (or answers a built-in tool inside one model turn): a maximal
  run of them makes **one** ``assistant`` message, a *group*: ``message`` items of role
  ``assistant`` give its text (``output_text``/``refusal`` parts), ``function_call`` and
  ``custom_tool_call`` items its tool calls (``id`` = ``call_id``; arguments = the call's
  ``arguments`` text, or the custom call's ``input`` text), and everything else (``reasoning``
  with its ``encrypted_content``, ``compaction``, ``web_search_call``, ``local_shell_call`` and
  its output, ``mcp_call``, ``item_reference`` …) is kept in :attr:`Message.provider_blocks`:
  not scored, but counted against B because it is forwarded (docs/architecture.md, invariant
  §5.8). A group is rendered whole or left out whole, so a reasoning item always keeps the item
  that follows it.

``provider_blocks`` leave out each item's ``id``, ``status`` and ``None`` fields, so that a group a
client echoes back (with or without those) equals the answer the proxy stored from the response.

Every canonical message keeps its wire items (:class:`Piece`); a message a policy rendered
unchanged is sent as those items, byte for byte (a reasoning item's ``encrypted_content``, a
compaction item, unknown fields and item types); only placeholders, excerpts, markers and
summaries are rebuilt (:func:`from_canonical`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from historygraph.history.events import EventError, Message, ToolCall, checked_media_of, content_text
from historygraph.signals.calibration import Usage

OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
CALL_ITEMS = ("function_call", "custom_tool_call")
USER_ROLES = {"user": "user", "system": "system", "developer": "system"}
PASSTHROUGH_FIELDS = ("previous_response_id", "conversation")
"""Request fields that name state kept by the provider, which the proxy cannot see: such a
request is forwarded unchanged (docs/proxy.md)."""


@dataclass(frozen=True)
class Piece:
    """The wire original of one canonical message: ``items``, the input items it came from (one
    for a user/system message or a tool result, the whole group for an assistant message; empty
    for the ``instructions`` system message, which is not an item)."""

    items: tuple[Any, ...]


def passthrough_reason(body: dict[str, Any]) -> str | None:
    """The first of :data:`PASSTHROUGH_FIELDS` ``body`` sets (not ``None``), else ``None``."""
    return next((k for k in PASSTHROUGH_FIELDS if body.get(k) is not None), None)


def item_type(item: Any) -> str:
    """An input item's ``type``; a ``message`` when it has none but a role (EasyInputMessage)."""
    if not isinstance(item, dict):
        return ""
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return kind if isinstance(kind, str) else ""


def provider_blocks_of(items: list[Any]) -> str:
    """:attr:`Message.provider_blocks` of ``items``: compact JSON, sorted keys, each item without
    ``id``, ``status`` and ``None`` fields; ``""`` for none."""
    if not items:
        return ""
    kept = [{k: v for k, v in it.items() if v is not None and k not in ("id", "status")} for it in items]
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _text(content: Any, where: str) -> str:
    try:
        return content_text(content)
    except EventError as exc:
        raise EventError(f"{where}: {exc}") from None


def _call_of(item: dict[str, Any], where: str) -> ToolCall:
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not call_id:
        raise EventError(f"{where}.call_id is missing")
    if not isinstance(name, str) or not name:
        raise EventError(f"{where}.name is missing")
    args = item.get("arguments") if item.get("type") == "function_call" else item.get("input")
    if not isinstance(args, str):
        raise EventError(f"{where}.{'arguments' if item.get('type') == 'function_call' else 'input'} must be a string")
    return ToolCall(call_id, name, args)


def group_message(items: list[Any], where: str = "response.output", start: int = 0) -> Message:
    """The canonical assistant message of one group of model items (see the module docstring);
    ``items[0]`` is ``<where>[<start>]`` in errors."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    extra: list[Any] = []
    for j, it in enumerate(items, start):
        kind = item_type(it)
        if kind == "message":
            texts.append(_text(it.get("content"), f"{where}[{j}].content"))
        elif kind in CALL_ITEMS:
            calls.append(_call_of(it, f"{where}[{j}]"))
        else:
            extra.append(it)
    return Message("assistant", "\n".join(t for t in texts if t), tuple(calls), provider_blocks=provider_blocks_of(extra))


def _single(item: dict[str, Any], kind: str, where: str) -> Message:
    """The canonical message of a user/system message item or a tool-output item."""
    if kind in OUTPUT_ITEMS:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise EventError(f"{where}.call_id is missing")
        return Message("tool", _text(item.get("output"), f"{where}.output"), tool_call_id=call_id,
                       media=checked_media_of(item.get("output"), f"{where}.output"))
    return Message(USER_ROLES[item["role"]], _text(item.get("content"), f"{where}.content"),
                   media=checked_media_of(item.get("content"), f"{where}.content"))


def _is_single(item: Any, kind: str, where: str) -> bool:
    """Whether ``item`` stands alone (a user/system message or a tool output), not in a group."""
    if not isinstance(item, dict):
        raise EventError(f"{where} must be an object, got {type(item).__name__}")
    if kind == "message":
        role = item.get("role")
        if role not in (*USER_ROLES, "assistant"):
            raise EventError(f"{where}.role must be one of user, assistant, system, developer; got {role!r}")
        return role != "assistant"
    if not kind:
        raise EventError(f"{where}.type is missing")
    return kind in OUTPUT_ITEMS


def to_canonical(instructions: Any, items: Any) -> tuple[list[Message], list[Piece]]:
    """Convert a Responses request's ``instructions`` and ``input`` (a string or a list of items).

    Returns:
        ``(canonical, pieces)``: canonical messages and, index for index, their :class:`Piece`.

    Raises:
        EventError: naming the field at fault (``input[3].call_id is missing`` …).
    """
    out: list[Message] = []
    pieces: list[Piece] = []
    if instructions is not None and not isinstance(instructions, (str, list)):
        raise EventError(f"instructions must be a string, got {type(instructions).__name__}")
    if instructions:
        out.append(Message("system", _text(instructions, "instructions")))
        pieces.append(Piece(()))
    if isinstance(items, str):
        out.append(Message("user", items))
        pieces.append(Piece((items,)))
        return out, pieces
    if not isinstance(items, list):
        raise EventError(f"input must be a string or a list of items, got {type(items).__name__}")
    group: list[Any] = []
    start = 0

    def close() -> None:
        if group:
            out.append(group_message(group, "input", start))
            pieces.append(Piece(tuple(group)))
            group.clear()

    for i, it in enumerate(items):
        kind = item_type(it)
        if _is_single(it, kind, f"input[{i}]"):
            close()
            out.append(_single(it, kind, f"input[{i}]"))
            pieces.append(Piece((it,)))
        else:
            if not group:
                start = i
            group.append(it)
    close()
    return out, pieces


def _custom_call_ids(pieces: list[Piece | None]) -> set[str | None]:
    return {it.get("call_id") for p in pieces if p is not None for it in p.items
            if isinstance(it, dict) and it.get("type") == "custom_tool_call"}


def _rebuilt_group(m: Message, piece: Piece | None) -> list[Any]:
    """The items of an assistant message shown changed (a brief) or made by the rendering: the
    group's items other than assistant text, with the shown text where that text was."""
    text = [{"role": "assistant", "content": m.content}] if m.content else []
    if piece is None:
        calls = [{"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]
        return text + calls
    out: list[Any] = []
    for it in piece.items:
        if item_type(it) == "message":
            out += text
            text = []
        else:
            out.append(it)
    return text + out


def from_canonical(messages: list[Message], pieces: list[Piece | None]) -> list[Any]:
    """The ``input`` items for a rendering: ``pieces[i]`` is the :class:`Piece` of
    ``messages[i]`` or ``None`` (made by the rendering). Originals are used for messages shown
    unchanged; a tool result shown changed keeps its item type (``custom_tool_call_output`` for a
    custom call); the ``instructions`` message is left out (it stays in its own field)."""
    custom = _custom_call_ids(pieces)
    out: list[Any] = []
    for m, piece in zip(messages, pieces):
        if piece is not None and not piece.items:
            continue  # the instructions
        if piece is not None and m.rendered_as is None:
            out.extend(piece.items)
        elif m.role == "tool":
            kind = "custom_tool_call_output" if m.tool_call_id in custom else "function_call_output"
            out.append({"type": kind, "call_id": m.tool_call_id, "output": m.content})
        elif m.role == "assistant":
            out.extend(_rebuilt_group(m, piece))
        else:
            out.append({"role": "developer" if m.role == "system" else "user", "content": m.content})
    return out


def responses_usage(obj: Any) -> Usage | None:
    """Usage of a Response object (or of a ``response.completed`` event, under ``response``):
    ``usage.input_tokens`` includes ``input_tokens_details.cached_tokens`` and
    ``cache_write_tokens`` (``openai.types.responses.ResponseUsage``)."""
    if isinstance(obj, dict) and isinstance(obj.get("response"), dict):
        obj = obj["response"]
    u = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(u, dict) or not isinstance(u.get("input_tokens"), int):
        return None
    d = u.get("input_tokens_details")
    details: dict = d if isinstance(d, dict) else {}
    c, w = details.get("cached_tokens"), details.get("cache_write_tokens")
    cached = c if isinstance(c, int) else 0
    written = w if isinstance(w, int) else 0
    return Usage(max(0, u["input_tokens"] - cached - written), max(0, cached), max(0, written))


def answer_message(response: Any) -> Message | None:
    """The canonical assistant message of a Response object (its ``output`` items as one group),
    ``None`` when it has no output or failed."""
    if not isinstance(response, dict) or response.get("status") == "failed":
        return None
    output = response.get("output")
    if not isinstance(output, list) or not output:
        return None
    return group_message(output)


class StreamAccumulator:
    """Rebuilds a Response from its stream events (``openai.types.responses.ResponseStreamEvent``).

    ``response.output_item.done`` gives each finished item (kept by ``output_index``); the
    terminal ``response.completed``/``response.incomplete`` carry the whole response, whose
    ``output`` wins when present, and its usage. ``response.failed`` and ``error`` end the stream
    without an answer. :meth:`message` is ``None`` until a terminal event came.
    """

    api = "responses"

    def __init__(self) -> None:
        self.items: dict[int, Any] = {}
        self.response: dict[str, Any] | None = None
        self.failed = False
        self.complete = False
        self.usage: Usage | None = None

    def feed(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self.items[int(event.get("output_index") or 0)] = event["item"]
        elif kind in ("response.completed", "response.incomplete"):
            self.response = event.get("response") if isinstance(event.get("response"), dict) else {}
            self.usage = responses_usage(self.response)
            self.complete = True
        elif kind in ("response.failed", "error"):
            self.failed = self.complete = True

    def message(self) -> Message | None:
        if not self.complete or self.failed:
            return None
        output = (self.response or {}).get("output") or [self.items[k] for k in sorted(self.items)]
        try:
            return group_message(output) if output else None
        except EventError:
            return None

    @staticmethod
    def usage_of(data: Any) -> Usage | None:
        """:func:`responses_usage` of a non-streamed answer."""
        return responses_usage(data)

    @staticmethod
    def answer_of(data: Any) -> Message | None:
        """:func:`answer_message` of a non-streamed answer."""
        return answer_message(data)

    @staticmethod
    def cut_event(message: str) -> bytes:
        """The ``error`` event the client gets when the upstream stream is cut mid-way."""
        data = {"type": "error", "code": "upstream_stream_cut", "message": message, "param": None, "sequence_number": 0}
        return ("event: error\ndata: " + json.dumps(data) + "\n\n").encode()
