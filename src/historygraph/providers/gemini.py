"""Google Gemini API (``models.generateContent``, ``models.streamGenerateContent``) ⇄ canonical
OpenAI-form :class:`~historygraph.history.events.Message`.

Source: Google's Gemini API reference, "Generating content" (``GenerateContentRequest``:
``contents``, ``systemInstruction``, ``tools``; ``GenerateContentResponse``: ``candidates``,
``usageMetadata``), "Content" (``Content`` with ``role`` ``user`` or ``model`` and ``parts``;
``Part``: ``text``, ``inlineData``, ``functionCall``, ``functionResponse``, ``fileData``,
``executableCode``, ``codeExecutionResult``, with ``thought`` and ``thoughtSignature``), and the
"Function calling" guide (the model's turn of ``functionCall`` parts is answered by the next user
turn with one ``functionResponse`` part per call, named as the call; ``response`` an object with
an ``output`` or ``error`` key) and "Thought signatures" (a signature is sent back in the part it
came in).

Conversion of a request (:func:`to_canonical`):

* ``systemInstruction`` (a ``Content``) → one ``system`` message first, its text parts joined by
  newlines; it travels on in its own field;
* a ``model`` turn → one ``assistant`` message: its text parts (not ``thought`` ones) concatenated
  as the stream delivers them, its ``functionCall`` parts as tool calls (``arguments`` =
  ``json.dumps(args)``; the id is :func:`call_id` ``gemini-<turn>-<k>``, the turn's index in
  ``contents`` and the call's ordinal in it, which the answer stored from the response and the
  client's echo of it share: a call's own ``id`` is no key, Gemini CLI gives each call an id of its
  own when it echoes the answer). Every other part (thoughts, executable code and its result, file
  data) and every ``thoughtSignature`` is kept in :attr:`Message.provider_blocks`: not scored,
  counted against B because it is forwarded (docs/architecture.md, invariant §5.8). The answer
  stored from a response leaves its thought summaries (``thought: true`` parts) out: Gemini CLI
  leaves them out of the history it sends back, and a request that does send them counts them
  with its model turn;
* a ``user`` turn (``role`` left out counts as ``user``) → one ``tool`` message per
  ``functionResponse`` part, paired with a call of the previous turn (by the wire ``id`` when both
  have one, else the first call of that name not yet answered), then one ``user`` message with the
  other parts (text joined by newlines; ``inlineData`` parts stored whole in
  :attr:`Message.media`, an ``[inlineData]`` marker in the text where each was, charged by Google's
  estimate, :mod:`historygraph.signals.media`).

A tool message's text is its response's value when the ``response`` object has one key holding a
string (``{"output": "..."}``), else the response's JSON text.

Every canonical message keeps its wire original (:class:`Piece`); a message rendered unchanged is
sent as that original, byte for byte (thought signatures, unknown fields); a placeholder, excerpt
or brief view is rebuilt (:func:`from_canonical`), and consecutive turns of one role are merged
into one, so the contents alternate as the API expects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from historygraph.history.events import EventError, Message, ToolCall
from historygraph.signals.calibration import Usage

ROLES = ("user", "model")
DATA_FIELDS = ("text", "inlineData", "functionCall", "functionResponse", "fileData", "executableCode",
               "codeExecutionResult")
"""The fields of which a ``Part`` holds exactly one (Google's reference: ``Part``, union ``data``)."""
MEDIA_MARKER = "[inlineData]"


@dataclass(frozen=True)
class Piece:
    """The wire original of one canonical message: ``value`` is a whole ``model`` turn (its
    ``Content`` object), one ``functionResponse`` part, or the list of a user turn's other parts;
    ``turn`` is the index in ``contents`` it came from."""

    value: Any
    turn: int


def call_id(turn: int, k: int) -> str:
    """The canonical id of the ``k``-th ``functionCall`` (from 0) of ``contents[turn]`` when the
    call has no ``id`` of its own."""
    return f"gemini-{turn}-{k}"


def _blocks(extra: list[Any]) -> str:
    return json.dumps(extra, sort_keys=True, separators=(",", ":"), ensure_ascii=False) if extra else ""


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    """The checked ``parts`` of a ``Content`` object at ``where``."""
    if not isinstance(content, dict):
        raise EventError(f"{where} must be a Content object {{\"role\", \"parts\"}}, got {type(content).__name__}")
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise EventError(f"{where}.parts must be a non-empty list of parts")
    for j, p in enumerate(parts):
        if not isinstance(p, dict):
            raise EventError(f"{where}.parts[{j}] must be an object, got {type(p).__name__}")
        held = [f for f in DATA_FIELDS if f in p]
        if len(held) != 1:
            raise EventError(f"{where}.parts[{j}] must hold exactly one of {', '.join(DATA_FIELDS)}; "
                             f"it holds {', '.join(held) or 'none'}")
        if "text" in p and not isinstance(p["text"], str):
            raise EventError(f"{where}.parts[{j}].text must be a string")
        if "inlineData" in p:
            _check_inline(p["inlineData"], f"{where}.parts[{j}]")
    return parts


def _check_inline(data: Any, where: str) -> None:
    if not isinstance(data, dict) or not isinstance(data.get("mimeType"), str) or not isinstance(data.get("data"), str):
        raise EventError(f"{where}.inlineData must be an object {{\"mimeType\": str, \"data\": <base64>}}")


def _response_parts(fr: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The checked ``parts`` of a ``functionResponse`` at ``where`` (media a function returns:
    ``FunctionResponsePart`` objects, each an ``inlineData`` blob); ``[]`` without them."""
    parts = fr.get("parts")
    if parts is None:
        return []
    if not isinstance(parts, list):
        raise EventError(f"{where}.functionResponse.parts must be a list of parts, got {type(parts).__name__}")
    for k, q in enumerate(parts):
        if not isinstance(q, dict):
            raise EventError(f"{where}.functionResponse.parts[{k}] must be an object, got {type(q).__name__}")
        if "inlineData" in q:
            _check_inline(q["inlineData"], f"{where}.functionResponse.parts[{k}]")
    return parts


def model_message(content: Any, turn: int, where: str, answer: bool = False) -> Message:
    """The canonical assistant message of a ``model`` turn ``contents[turn]`` (or, ``answer``, of a
    response's candidate, ``turn`` then being the index its turn will have in the next request;
    its thought summaries left out)."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    extra: list[Any] = []
    for j, p in enumerate(_parts(content, where)):
        if answer and p.get("thought"):
            continue
        meta = {k: v for k, v in p.items() if k not in ("text", "functionCall")}
        if "functionCall" in p:
            fc = p["functionCall"]
            if not isinstance(fc, dict) or not isinstance(fc.get("name"), str) or not fc["name"]:
                raise EventError(f"{where}.parts[{j}].functionCall.name is missing")
            args = fc.get("args", {})
            if args is not None and not isinstance(args, dict):
                raise EventError(f"{where}.parts[{j}].functionCall.args must be an object")
            calls.append(ToolCall(call_id(turn, len(calls)), fc["name"], json.dumps(args or {}, ensure_ascii=False)))
            if meta:
                extra.append(meta)
        elif "text" in p and not p.get("thought"):
            texts.append(p["text"])
            if meta:
                extra.append(meta)
        else:
            extra.append(p)
    return Message("assistant", "".join(texts), tuple(calls), provider_blocks=_blocks(extra))


def _response_text(response: Any) -> str:
    if isinstance(response, dict) and len(response) == 1 and isinstance(next(iter(response.values())), str):
        return next(iter(response.values()))
    return json.dumps(response, ensure_ascii=False)


def _media(parts: list[dict[str, Any]]) -> str:
    return _blocks([{"type": "inlineData", "inlineData": p["inlineData"]} for p in parts if "inlineData" in p])


def _user_messages(parts: list[dict[str, Any]], turn: int, open_calls: list[tuple[ToolCall, Any]], where: str
                   ) -> list[tuple[Message, Piece]]:
    """The canonical messages of a user turn: its function responses (answering ``open_calls``,
    the previous model turn's calls with their wire ids, removed as they are answered), then its
    other parts."""
    out: list[tuple[Message, Piece]] = []
    rest: list[dict[str, Any]] = []
    for j, p in enumerate(parts):
        if "functionResponse" not in p:
            rest.append(p)
            continue
        fr = p["functionResponse"]
        if not isinstance(fr, dict) or not isinstance(fr.get("name"), str) or not fr["name"]:
            raise EventError(f"{where}.parts[{j}].functionResponse.name is missing")
        if "response" in fr and not isinstance(fr["response"], dict):
            raise EventError(f"{where}.parts[{j}].functionResponse.response must be an object")
        media = _media(_response_parts(fr, f"{where}.parts[{j}]"))
        own = fr.get("id")
        found = next((c for c in open_calls if isinstance(own, str) and own and c[1] == own), None) or \
            next((c for c in open_calls if c[0].name == fr["name"]), None)
        if found is None:
            raise EventError(f"{where}.parts[{j}]: a functionResponse named {fr['name']!r} answers no functionCall of "
                             f"the model turn before it (contents[{turn - 1}]); each model turn's functionCall parts are "
                             "answered by the next user turn, one functionResponse per call, with the same names")
        open_calls.remove(found)
        out.append((Message("tool", _response_text(fr.get("response", {})), tool_call_id=found[0].id, name=fr["name"],
                            media=media),
                    Piece(p, turn)))
    if rest:
        texts = [p["text"] if "text" in p else MEDIA_MARKER if "inlineData" in p else "" for p in rest]
        extra = [p for p in rest if "text" not in p and "inlineData" not in p]
        out.append((Message("user", "\n".join(t for t in texts if t), provider_blocks=_blocks(extra), media=_media(rest)),
                    Piece(rest, turn)))
    return out


def system_text(instruction: Any) -> str:
    """The text of a request's ``systemInstruction`` (a ``Content`` whose text parts are joined by
    newlines). Raises :class:`EventError` naming the field."""
    parts = _parts(instruction, "systemInstruction")
    return "\n".join(p["text"] for p in parts if "text" in p)


def to_canonical(instruction: Any, contents: Any) -> tuple[list[Message], list[Piece | None]]:
    """Convert a request's ``systemInstruction`` and ``contents`` (module docstring).

    Returns:
        ``(canonical, pieces)``: canonical messages and, index for index, their :class:`Piece`
        (``None`` for the ``systemInstruction`` message).

    Raises:
        EventError: naming the field at fault (``contents[3].parts[0].functionResponse …``),
            including a model turn's calls left without their responses in the next turn.
    """
    out: list[Message] = []
    pieces: list[Piece | None] = []
    if instruction is not None:
        out.append(Message("system", system_text(instruction)))
        pieces.append(None)
    if not isinstance(contents, list) or not contents:
        raise EventError("contents must be a non-empty list of Content objects")
    open_calls: list[tuple[ToolCall, Any]] = []  # the previous model turn's calls not yet answered, with their wire ids
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        parts = _parts(content, where)
        role = content.get("role") or "user"
        if role not in ROLES:
            raise EventError(f"{where}.role must be 'user' or 'model', got {role!r}")
        if open_calls and role == "model":
            raise EventError(f"contents[{i - 1}] calls {', '.join(c.name for c, _ in open_calls)} but {where} is not the user "
                             "turn of their functionResponse parts")
        if role == "model":
            m = model_message(content, i, where)
            out.append(m)
            pieces.append(Piece(content, i))
            wire = [p["functionCall"].get("id") for p in parts if "functionCall" in p]
            open_calls = list(zip(m.tool_calls, wire))
            continue
        before = len(open_calls)
        for m, piece in _user_messages(parts, i, open_calls, where):
            out.append(m)
            pieces.append(piece)
        if open_calls:
            raise EventError(f"{where} answers {'none' if len(open_calls) == before else 'only some'} of the functionCall parts of "
                             f"contents[{i - 1}] (no functionResponse for {', '.join(c.name for c, _ in open_calls)}); "
                             "the API needs one functionResponse per functionCall, with the same names")
    return out, pieces


def _args(call: ToolCall) -> Any:
    try:
        value = json.loads(call.arguments)
    except json.JSONDecodeError:
        return {"arguments": call.arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _rebuilt_model(m: Message, piece: Piece | None) -> list[Any]:
    """The parts of a model turn shown changed (a brief view) or made by the rendering: the
    original's parts other than its text, with the shown text where the first text was."""
    text = [{"text": m.content}] if m.content else []
    if piece is None:
        return text + [{"functionCall": {"name": c.name, "args": _args(c)}} for c in m.tool_calls]
    out: list[Any] = []
    for p in piece.value["parts"]:
        if "text" in p and not p.get("thought"):
            out += text
            text = []
        else:
            out.append(p)
    return text + out


def _rebuilt_response(m: Message, piece: Piece | None, name: str) -> dict[str, Any]:
    """The ``functionResponse`` part of a result shown changed (placeholder, excerpt) or made by
    the rendering: its text under the original's key when that held a string, else ``output``
    (``error`` stays ``error``, so the model is still told the call failed)."""
    fr = piece.value["functionResponse"] if piece is not None else {}
    original = fr.get("response")
    key = next(iter(original)) if isinstance(original, dict) and len(original) == 1 and "error" in original else "output"
    out: dict[str, Any] = {"name": fr.get("name") or name, "response": {key: m.content}}
    if isinstance(fr.get("id"), str):
        out["id"] = fr["id"]
    return {"functionResponse": out}


def from_canonical(messages: list[Message], pieces: list[Piece | None]) -> list[dict[str, Any]]:
    """The ``contents`` for a rendering: ``pieces[i]`` is the :class:`Piece` of ``messages[i]``
    or ``None`` (made by the rendering). Originals are sent for messages shown unchanged; the
    ``systemInstruction`` message is left out (it stays in its own field); consecutive turns of
    one role are merged (their parts in order)."""
    names: dict[str, str] = {}
    turns: list[dict[str, Any]] = []
    for m, piece in zip(messages, pieces):
        unchanged = piece is not None and m.rendered_as is None
        if m.role == "system":
            continue
        if m.role == "assistant":
            names.update((c.id, c.name) for c in m.tool_calls)
            turn = piece.value if unchanged and piece is not None else {"role": "model", "parts": _rebuilt_model(m, piece)}
        elif m.role == "tool":
            part = piece.value if unchanged and piece is not None else _rebuilt_response(m, piece, names.get(m.tool_call_id or "", m.name or ""))
            turn = {"role": "user", "parts": [part]}
        else:
            parts = piece.value if unchanged and piece is not None else ([{"text": m.content}] if m.content else [])
            turn = {"role": "user", "parts": parts}
        if not turn["parts"]:
            continue
        if turns and (turns[-1].get("role") or "user") == (turn.get("role") or "user"):
            turns[-1] = {**turns[-1], "parts": [*turns[-1]["parts"], *turn["parts"]]}
        else:
            turns.append(turn)
    return turns


def gemini_usage(obj: Any) -> Usage | None:
    """Usage of a ``GenerateContentResponse`` (or a stream chunk): ``usageMetadata.promptTokenCount``
    includes ``cachedContentTokenCount`` (Google's reference, ``UsageMetadata``); no cache writes
    are reported."""
    u = obj.get("usageMetadata") if isinstance(obj, dict) else None
    if not isinstance(u, dict) or not isinstance(u.get("promptTokenCount"), int):
        return None
    c = u.get("cachedContentTokenCount")
    cached = c if isinstance(c, int) else 0
    return Usage(max(0, u["promptTokenCount"] - cached), max(0, cached), 0)


def _candidate_content(obj: Any) -> Any:
    candidates = obj.get("candidates") if isinstance(obj, dict) else None
    if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
        return None
    return candidates[0].get("content")


class StreamAccumulator:
    """Rebuilds candidate 0's model turn from ``streamGenerateContent`` chunks (each a
    ``GenerateContentResponse``): text parts of one kind (thought or not) arriving in a row are
    concatenated, every other part appended; the chunk whose candidate has a ``finishReason`` ends
    the answer, ``usageMetadata`` of the latest chunk is its usage. A chunk holding ``error``, or a
    ``promptFeedback.blockReason`` (a blocked prompt, no candidate), ends the stream without an answer. Bound to the turn index its answer will have in the next request
    (:meth:`for_turn`), which the ids of its calls carry (:func:`call_id`)."""

    api = "gemini"
    turn = 0

    def __init__(self) -> None:
        self.parts: list[dict[str, Any]] = []
        self.complete = False
        self.failed = False
        self.usage: Usage | None = None

    @classmethod
    def for_turn(cls, turn: int) -> type["StreamAccumulator"]:
        """This class bound to ``turn``: the number of ``contents`` of the request it answers."""
        return type(cls.__name__, (cls,), {"turn": turn})

    def feed(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        if "error" in event:
            self.failed = self.complete = True
            return
        feedback = event.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):  # the prompt was blocked: the stream's last chunk
            self.complete = True
        self.usage = gemini_usage(event) or self.usage
        content = _candidate_content(event)
        for p in (content.get("parts") if isinstance(content, dict) else None) or ():
            last = self.parts[-1] if self.parts else None
            if (isinstance(p, dict) and isinstance(p.get("text"), str) and last is not None and "text" in last
                    and bool(last.get("thought")) == bool(p.get("thought"))):
                self.parts[-1] = {**last, **p, "text": last["text"] + p["text"]}
            elif isinstance(p, dict):
                self.parts.append(dict(p))
        candidates = event.get("candidates")
        if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict) and candidates[0].get("finishReason"):
            self.complete = True

    def message(self) -> Message | None:
        if not self.complete or self.failed or not self.parts:
            return None
        return model_message({"role": "model", "parts": self.parts}, self.turn, "response", answer=True)

    @staticmethod
    def usage_of(data: Any) -> Usage | None:
        """:func:`gemini_usage` of a non-streamed answer."""
        return gemini_usage(data)

    @classmethod
    def answer_of(cls, data: Any) -> Message | None:
        """The canonical assistant message of a non-streamed answer (candidate 0), ``None`` when it
        has no content."""
        content = _candidate_content(data)
        if not isinstance(content, dict) or not content.get("parts"):
            return None
        return model_message(content, cls.turn, "response", answer=True)
