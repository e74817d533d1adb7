"""Anthropic Messages API ⇄ canonical OpenAI-form :class:`~historygraph.history.events.Message`.

Source: the Anthropic Messages API wire format (``system`` field, ``user``/``assistant`` turns whose
content is a string or a list of blocks: ``text``, ``image``, ``tool_use``, ``tool_result``,
``thinking``, ``redacted_thinking``).

Conversion to canonical form (:func:`to_canonical`):

* ``system`` (string or text blocks) → one ``system`` message first;
* a ``system`` turn inside ``messages`` (a mid-conversation system message; Claude Code puts its
  environment block there, after the first user message) → one ``system`` message at its place:
  outside B like every system message, never dropped, and sent back as the client sent it, at
  the same place;
* a user turn → one ``tool`` message per ``tool_result`` block (in block order), then one ``user``
  message with the remaining blocks flattened to text, if there are any. In a turn that holds
  tool results, blocks after the last result belong to the tool loop, not to a new user turn:
  they travel with the last result (:attr:`Piece.tail`, and its :attr:`Message.provider_blocks`,
  so they are counted against B) and are sent after the results as the client sent them;
* an assistant turn → one ``assistant`` message: text blocks joined by newlines, ``tool_use``
  blocks as tool calls whose arguments are ``json.dumps(input)``. Every other block (``thinking``,
  ``redacted_thinking``, ``server_tool_use``, ``web_search_tool_result`` and any other server-tool
  block) is kept, in order, in :attr:`Message.provider_blocks`: not scored, but counted against B
  because it is forwarded (docs/architecture.md, invariant §5.8). Non-text user blocks other than images and documents
  are kept there too; ``image`` and ``document`` blocks (of a user turn or inside a
  ``tool_result``) are stored whole in :attr:`Message.media` (an ``[image]``-style marker in the
  text where each was) and charged by the provider's estimate (Anthropic "Vision": about
  width × height / 750 tokens; :mod:`historygraph.signals.media`), not by their bytes.

Every canonical message keeps a pointer to its wire original (:class:`Piece`). The proxy sends a
message that a policy rendered unchanged as that original, so thinking blocks (with their
signatures), images and unknown fields reach the upstream byte-for-byte; only placeholders and
excerpts are rebuilt (:func:`from_canonical`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from historygraph.history.events import CACHE_MARK, EventError, Message, ToolCall, checked_media_of, content_text
from historygraph.providers.anthropic_cache import cache_control_of, with_cache_control
from historygraph.signals.calibration import Usage, anthropic_usage


@dataclass(frozen=True)
class Piece:
    """The wire original of one canonical message: ``value`` is a whole assistant turn (its message
    object), the non-tool-result part of a user turn (a string or block list) or one
    ``tool_result`` block; ``turn`` is the index of the wire turn it came from. ``tail``: on the
    last ``tool_result`` of a user turn, the blocks the client put after its results (Claude Code's
    ``"Tool loaded."`` text after loading a deferred tool): part of the tool loop, not a new user
    turn; they are sent after the turn's results however the result itself is shown."""

    value: Any
    turn: int
    tail: tuple[Any, ...] = ()


UNCOUNTED_USER_BLOCKS = ("text", "image", "document", "tool_result")


def provider_blocks_of(blocks: list[Any]) -> str:
    """:attr:`Message.provider_blocks` of ``blocks``: compact JSON with sorted keys, ``None``
    fields left out (clients echo blocks with and without them) and so is a block's
    ``cache_control`` (a breakpoint the client moves at every call, not content:
    :data:`~historygraph.history.events.CACHE_MARK`), ``""`` for none."""
    if not blocks:
        return ""
    return json.dumps([{k: v for k, v in b.items() if v is not None and k != CACHE_MARK} for b in blocks],
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def arguments_of(tool_input: Any) -> str:
    """Canonical tool-call arguments text of a ``tool_use`` input object."""
    return json.dumps(tool_input, ensure_ascii=False)


def _text(content: Any, field: str) -> str:
    try:
        return content_text(content)
    except EventError as exc:
        raise EventError(f"{field}: {exc}") from None


def to_canonical(system: Any, messages: Any) -> tuple[list[Message], list[Piece | None]]:
    """Convert a Messages API request's ``system`` and ``messages``.

    Returns:
        ``(canonical, pieces)``: canonical messages and, index for index, their wire originals
        (``None`` for the system message of the ``system`` field, which the proxy passes on in
        that field).

    Raises:
        EventError: naming the field that is wrong (``messages[3].content[1].tool_use_id`` …).
    """
    if not isinstance(messages, list):
        raise EventError("messages must be a list")
    return join_turns(system, [turn_to_canonical(turn, i) for i, turn in enumerate(messages)])


def join_turns(system: Any, turns: list[list[tuple[Message, Piece]]]) -> tuple[list[Message], list[Piece | None]]:
    """:func:`to_canonical`'s result from ``system`` and each turn's :func:`turn_to_canonical`
    (which depends on that turn and its index alone, so a caller may keep the conversions of
    turns it has seen)."""
    out: list[Message] = []
    pieces: list[Piece | None] = []
    if system:
        out.append(Message("system", _text(system, "system")))
        pieces.append(None)
    for converted in turns:
        for m, piece in converted:
            out.append(m)
            pieces.append(piece)
    return out, pieces


def turn_to_canonical(turn: Any, i: int) -> list[tuple[Message, Piece]]:
    """The canonical messages of wire turn ``messages[i]``, each with its :class:`Piece`.

    Raises:
        EventError: naming the field that is wrong.
    """
    where = f"messages[{i}]"
    if not isinstance(turn, dict):
        raise EventError(f"{where} must be an object")
    role, content = turn.get("role"), turn.get("content")
    if role not in ("user", "assistant", "system"):
        raise EventError(f"{where}.role must be 'user', 'assistant' or 'system', got {role!r}")
    if role == "system":
        return [(Message("system", _text(content, f"{where}.content")), Piece(turn, i))]
    blocks = content if isinstance(content, list) else None
    if role == "assistant":
        return [(_assistant(content, blocks, where), Piece(turn, i))]
    if blocks is None:
        return [(Message("user", _text(content, f"{where}.content")), Piece(content, i))]
    out: list[tuple[Message, Piece]] = []
    rest = []
    last = max((j for j, b in enumerate(blocks) if isinstance(b, dict) and b.get("type") == "tool_result"), default=-1)
    for j, b in enumerate(blocks):
        if isinstance(b, dict) and b.get("type") == "tool_result":
            if not b.get("tool_use_id"):
                raise EventError(f"{where}.content[{j}].tool_use_id is missing")
            tail = tuple(blocks[j + 1:]) if j == last else ()
            out.append((Message("tool", _text(b.get("content"), f"{where}.content[{j}].content"),
                                tool_call_id=str(b["tool_use_id"]), provider_blocks=provider_blocks_of(list(tail)),
                                media=checked_media_of(b.get("content"), f"{where}.content[{j}].content")),
                        Piece(b, i, tail)))
        elif j > last >= 0:
            continue  # after the turn's last result: its tail
        else:
            rest.append(b)
    if rest:
        extra = [b for b in rest if isinstance(b, dict) and b.get("type") not in UNCOUNTED_USER_BLOCKS]
        # rest's media parts, checked where they are in the turn (its tool_result blocks are not media)
        media = checked_media_of(blocks[:last + 1] if last >= 0 else blocks, f"{where}.content")
        out.append((Message("user", _text(rest, f"{where}.content"), provider_blocks=provider_blocks_of(extra),
                            media=media),
                    Piece(rest, i)))
    return out


def _assistant(content: Any, blocks: list | None, where: str) -> Message:
    if blocks is None:
        return Message("assistant", _text(content, f"{where}.content"))
    texts, calls, extra = [], [], []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict):
            raise EventError(f"{where}.content[{j}] must be an object")
        if b.get("type") == "text":
            texts.append(str(b.get("text", "")))
        elif b.get("type") == "tool_use":
            if not b.get("id") or not b.get("name"):
                raise EventError(f"{where}.content[{j}]: a tool_use block needs id and name")
            calls.append(ToolCall(str(b["id"]), str(b["name"]), arguments_of(b.get("input", {}))))
        else:
            extra.append(b)
    return Message("assistant", "\n".join(texts), tuple(calls), provider_blocks=provider_blocks_of(extra))


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        tool_input = json.loads(call.arguments)
    except json.JSONDecodeError:
        tool_input = {"arguments": call.arguments}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input}


def _tool_result(m: Message, piece: Piece | None) -> dict[str, Any]:
    """The ``tool_result`` block of a result shown changed (a placeholder, an excerpt): its text,
    and ``is_error: true`` when the client marked the original so (the model is still told the
    call failed)."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
    if piece is not None and isinstance(piece.value, dict) and piece.value.get("is_error") is True:
        block["is_error"] = True
    return block


def from_canonical(messages: list[Message], pieces: list[Piece | None],
                   moved: dict[int, dict[str, Any]] | None = None,
                   places: list[tuple[int, int] | None] | None = None) -> list[dict[str, Any]]:
    """Build the Messages API ``messages`` list for a rendering (the system message of the
    ``system`` field, which has no piece, is skipped; a system turn of ``messages`` is sent at its
    place).

    ``pieces[i]`` is the wire original for ``messages[i]`` or ``None``; an original is used when
    the message is shown unchanged (``rendered_as is None``). Tool results keep the user turns they
    came in, with their :attr:`Piece.tail`; synthetic results join the turn being built. A user
    message (the client's text, a marker, a summary) is its own user turn, after any pending
    results: in the results' turn its text would come after them and :func:`to_canonical` would
    read it back as their tail, charged as provider blocks rather than as the user message the
    rendering counted (the forwarded history then exceeds B). The API merges consecutive user
    turns, so the model sees the same content.

    Prompt-cache breakpoints (:mod:`historygraph.providers.anthropic_cache`, rule 1): a message
    rebuilt from its original (a placeholder, an excerpt) keeps the original's ``cache_control``
    on its last block; ``moved`` (``{index in messages: cache_control}``,
    :func:`~historygraph.providers.anthropic_cache.moved_breakpoints`) puts those of messages left
    out on the message at that index. A message that already carries one gets no second.

    ``places`` (a list as long as ``messages``, filled in place): where each message lands, ``(turn
    index, content block index)`` (a tool result: its own block in the turn it shares; another
    message: its turn's last block), ``None`` for a system message sent in the ``system`` field
    (:func:`boundary_block` reads it).
    """
    moved = moved or {}
    out: list[dict[str, Any]] = []
    pending: list[Any] = []
    tails: list[Any] = []  # blocks after the pending results (Piece.tail)
    pending_turn: int | None = None
    pending_at: list[int] = []  # the message index of each pending result

    def place(i: int) -> None:  # message i is the last turn appended
        if places is not None:
            content = out[-1].get("content")
            places[i] = (len(out) - 1, len(content) - 1 if isinstance(content, list) else 0)

    def flush(extra: Any = None) -> None:
        nonlocal pending, pending_turn
        if pending:
            if places is not None:
                for k, j in enumerate(pending_at):
                    places[j] = (len(out), k)
            out.append({"role": "user", "content": pending + tails})
        if extra is not None:
            out.append({"role": "user", "content": extra})
        pending, pending_turn = [], None
        pending_at.clear()
        tails.clear()

    for i, (m, piece) in enumerate(zip(messages, pieces)):
        original = piece.value if piece is not None and m.rendered_as is None else None
        turn = piece.turn if piece is not None else pending_turn
        if m.role == "system" and piece is None:
            continue
        if pending and turn != pending_turn:
            flush()
        cc = moved.get(i) or (cache_control_of(piece.value) if piece is not None and original is None else None)

        if m.role == "system":
            flush()
            out.append(_keep_breakpoint(cc, original if original is not None else {"role": "system", "content": m.content}))
            place(i)
        elif m.role == "assistant":
            flush()
            out.append(_keep_breakpoint(cc, original if original is not None else
                              {"role": "assistant", "content": (json.loads(m.provider_blocks) if m.provider_blocks else [])
                               + ([{"type": "text", "text": m.content}] if m.content else [])
                               + [_tool_use(c) for c in m.tool_calls]}))
            place(i)
        elif m.role == "tool":
            pending.append(_keep_breakpoint(cc, original if original is not None else _tool_result(m, piece)))
            pending_at.append(i)
            pending_turn = turn
            tails.extend(piece.tail if piece is not None else ())
        else:
            flush(_keep_breakpoint(cc, original if original is not None else m.content))
            place(i)
    flush()
    return out


def boundary_block(places: list[tuple[int, int] | None], boundary: int) -> tuple[int, int] | None:
    """Where the last of the first ``boundary`` messages of a rendering lands in
    :func:`from_canonical`'s ``messages`` list (``places``, as :func:`from_canonical` filled it):
    ``(turn index, content block index)``, a message sent in the ``system`` field standing for the
    one before it; ``None`` when ``boundary`` is 0 or none of those messages makes a turn. The proxy
    puts a cache breakpoint there: the end of a cache-stable rendering's generation
    (:mod:`historygraph.policies.cache_stable`, ``Rendering.stats["cache_boundaries"]``)."""
    return next((w for w in reversed(places[:max(boundary, 0)]) if w is not None), None)


def _keep_breakpoint(cc: dict[str, Any] | None, wire: Any) -> Any:
    """``wire`` with ``cc`` on its last block, unless ``cc`` is ``None`` or it carries one already."""
    return wire if cc is None or cache_control_of(wire) is not None else with_cache_control(wire, cc)


def answer_message(response: dict[str, Any]) -> Message:
    """The canonical assistant message of a Messages API response object (``content`` blocks)."""
    return _assistant(response.get("content"), response.get("content") if isinstance(response.get("content"), list) else None,
                      "response")


class StreamAccumulator:
    """Rebuilds the response content blocks from Messages API stream events.

    Feed it every parsed ``data:`` object (``content_block_start``, ``content_block_delta`` with
    ``text_delta``/``input_json_delta``/``thinking_delta``/``signature_delta``, ``message_stop``);
    :meth:`message` then gives the canonical answer, or ``None`` if the stream did not complete.
    """

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.complete = False
        self.usage: Usage | None = None  # from message_start, updated by message_delta

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        idx: Any = event.get("index")  # the block's index: an int in the wire format (not checked)
        if kind in ("message_start", "message_delta"):
            self.usage = anthropic_usage(event, self.usage)
        if kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self.blocks[idx] = dict(event["content_block"])
        elif kind == "content_block_delta" and idx in self.blocks:
            delta = event.get("delta") or {}
            block = self.blocks[idx]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif delta.get("type") == "signature_delta":
                block["signature"] = block.get("signature", "") + delta.get("signature", "")
            elif delta.get("type") == "input_json_delta":
                self.partial_json.setdefault(idx, []).append(delta.get("partial_json", ""))
        elif kind == "message_stop":
            self.complete = True

    def message(self) -> Message | None:
        if not self.complete:
            return None
        blocks = []
        for idx in sorted(self.blocks):
            b = dict(self.blocks[idx])
            if idx in self.partial_json:  # tool_use and server_tool_use inputs
                text = "".join(self.partial_json[idx])
                b["input"] = json.loads(text) if text.strip() else {}
            blocks.append(b)
        return _assistant(blocks, blocks, "response")
