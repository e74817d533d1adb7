"""Value types for everything a session's context graph stores.

The canonical wire format is OpenAI chat messages (docs/architecture.md): an assistant message may
carry ``tool_calls`` and each tool result is a ``role: "tool"`` message with the
``tool_call_id`` of the call it answers. Every reader and adapter converts to these types and
every policy renders back to them with :meth:`Message.to_openai`.

Values are immutable: a policy never modifies what is stored (ContextRender §3.1). A rendering
that shows something other than the stored text (a placeholder, an excerpt) builds a new
``Message`` and marks it with ``rendered_as`` so that evaluators can tell it is not the original.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class EventError(ValueError):
    """An event that cannot be represented: names the field that is wrong."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A model's request to run a tool.

    ``arguments`` is the JSON text the model produced (OpenAI keeps it a string; it is not
    parsed here because real agents emit invalid JSON and we must store what the model said).
    """

    id: str
    name: str
    arguments: str = "{}"

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_openai(cls, data: dict[str, Any], index: int | None = None) -> "ToolCall":
        """Parse one entry of an OpenAI ``tool_calls`` list (``index``: its place there, named in
        errors). Raises EventError naming the field."""
        if not isinstance(data, dict):
            raise EventError(f"tool_calls[{'' if index is None else index}]: expected an object, got {type(data).__name__}")
        fn = data.get("function")
        if isinstance(fn, dict):
            name, args = fn.get("name"), fn.get("arguments", "{}")
        else:  # flat form used by tau2-bench: {id, name, arguments: dict}
            name, args = data.get("name"), data.get("arguments", "{}")
        if not data.get("id"):
            raise EventError(f"tool_calls[{'' if index is None else index}].id is missing")
        if not name:
            raise EventError(f"tool_calls[{data.get('id')}].function.name is missing")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return cls(id=str(data["id"]), name=str(name), arguments=args)


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message: a user or assistant message, or a tool result.

    Attributes:
        role: one of ``system``, ``user``, ``assistant``, ``tool``.
        content: the text the model saw (multimodal parts are flattened to their text parts).
        tool_calls: for assistant messages, the calls it made, in order.
        tool_call_id: for tool results, the id of the call answered.
        name: optional tool name on tool results.
        timestamp: seconds since the epoch when known, else ``None``.
        rendered_as: ``None`` for stored originals; ``"placeholder"`` or ``"excerpt"`` when a
            policy shows a stand-in for the stored text (docs/architecture.md, invariant §5.3).
        provider_blocks: compact JSON (sorted keys) of the provider content blocks that travel
            with the message but are not text a policy scores: Anthropic ``thinking`` and
            ``redacted_thinking`` blocks (signatures included), server-tool blocks
            (``server_tool_use``, ``web_search_tool_result`` …) and other non-text blocks; ``""``
            when none. They are forwarded byte for byte and counted against B with the message
            (docs/architecture.md, invariant §5.8).
        media: compact JSON (sorted keys) of the message's non-text content parts (images,
            documents, files, audio: :data:`MEDIA_TYPES`), each whole, base64 data included, in
            order; ``""`` when none. ``content`` holds a ``[type]`` marker where each was. Stored
            and restorable by id; charged to B by the provider's documented estimate, not by
            their bytes (:mod:`historygraph.signals.media`). A stand-in (placeholder, excerpt,
            brief view) does not carry them.
    """

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    timestamp: float | None = None
    rendered_as: str | None = None
    provider_blocks: str = ""
    media: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise EventError(f"role {self.role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(self.content, str):
            raise EventError(f"content of a {self.role} message must be text, got {type(self.content).__name__}")
        if self.role == "tool" and not self.tool_call_id:
            raise EventError("a tool message needs tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise EventError(f"only assistant messages carry tool_calls, not {self.role}")

    @property
    def is_tool_result(self) -> bool:
        return self.role == "tool"

    @property
    def opens_with_thinking(self) -> bool:
        """Whether the message's first provider block is a ``thinking`` or ``redacted_thinking``
        block (Anthropic extended thinking)."""
        if not self.provider_blocks.startswith("[{"):
            return False
        first = json.loads(self.provider_blocks)[0]
        return isinstance(first, dict) and first.get("type") in ("thinking", "redacted_thinking")

    def with_content(self, content: str, rendered_as: str) -> "Message":
        """A copy showing ``content`` instead of the stored text, marked ``rendered_as`` (the
        constructor called directly: ``dataclasses.replace`` costs several times more, and a
        reopened session's first render builds its placeholders this way). The stand-in does not
        carry :attr:`media`: what it shows is ``content``."""
        return Message(self.role, content, self.tool_calls, self.tool_call_id, self.name, self.timestamp,
                       rendered_as, self.provider_blocks)

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            out["name"] = self.name
        return out

    def to_dict(self) -> dict[str, Any]:
        """Lossless JSON-able form (used by stores): OpenAI fields plus timestamp and marks."""
        out = self.to_openai()
        if self.name is not None:
            out["name"] = self.name
        if self.timestamp is not None:
            out["timestamp"] = self.timestamp
        if self.rendered_as is not None:
            out["rendered_as"] = self.rendered_as
        if self.provider_blocks:
            out["provider_blocks"] = self.provider_blocks
        if self.media:
            out["media"] = self.media
        return out

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> "Message":
        """Parse an OpenAI chat message (also accepts what :meth:`to_dict` writes). The
        ``developer`` role (OpenAI's newer name for ``system``) is read as ``system``.

        Raises:
            EventError: naming the field that is wrong.
        """
        if not isinstance(data, dict):
            raise EventError(f"a message must be an object, got {type(data).__name__}")
        role = data.get("role")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if role not in ROLES:
            raise EventError(f"role {role!r} is not one of {', '.join(ROLES)}")
        listed = data.get("tool_calls")
        calls = tuple([ToolCall.from_openai(c, i) for i, c in enumerate(listed)]) if listed else ()
        ts = data.get("timestamp")
        return cls(
            role=role,
            content=content_text(data.get("content")),
            tool_calls=calls,
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            timestamp=float(ts) if isinstance(ts, (int, float)) else None,
            rendered_as=data.get("rendered_as"),
            provider_blocks=pb if isinstance(pb := data.get("provider_blocks"), str) else "",
            media=md if isinstance(md := data.get("media"), str) else checked_media_of(data.get("content")),
        )


def content_text(content: Any) -> str:
    """Flatten OpenAI/Anthropic content to text: ``None`` → ``""``, text parts joined by newlines.

    Non-text parts (images, audio) are represented by a short marker naming their type, because
    their bytes are not text the policies can score.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                else:
                    parts.append(f"[{part.get('type', 'part')}]")
        return "\n".join(parts)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return content["text"]
    raise EventError(f"content must be text or a list of parts, got {type(content).__name__}")


MEDIA_TYPES = ("image", "document", "image_url", "input_audio", "file", "input_image", "input_file", "inlineData")
"""Content-part types kept whole in :attr:`Message.media`: Anthropic Messages ``image`` and
``document`` blocks; OpenAI Chat Completions ``image_url``, ``input_audio`` and ``file`` parts;
OpenAI Responses ``input_image`` and ``input_file`` parts; Gemini ``inlineData`` parts, stored as
``{"type": "inlineData", "inlineData": {"mimeType", "data"}}`` (:mod:`historygraph.providers.gemini`)."""


CACHE_MARK = "cache_control"
"""A block's Anthropic prompt-cache breakpoint: where the cache may end, not content (the cached
prompt is the tools, system and message blocks; docs.anthropic.com/en/docs/build-with-claude/
prompt-caching). Clients move it at every call (Claude Code marks the last two messages), so the
stored forms of a message's blocks (:attr:`Message.media`, :attr:`Message.provider_blocks`) leave
it out: the same message re-sent without its mark is the same event."""


def unmarked(block: dict[str, Any]) -> dict[str, Any]:
    """``block`` without its :data:`CACHE_MARK` (the same object when it has none)."""
    return {k: v for k, v in block.items() if k != CACHE_MARK} if CACHE_MARK in block else block


def media_of(content: Any) -> str:
    """:attr:`Message.media` of ``content`` (a string or a list of parts): compact JSON with sorted
    keys of its parts of a :data:`MEDIA_TYPES` type, whole (but for a :data:`CACHE_MARK`) and in
    order; ``""`` for none."""
    if not isinstance(content, list):
        return ""
    parts = [unmarked(p) for p in content if isinstance(p, dict) and p.get("type") in MEDIA_TYPES]
    return json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False) if parts else ""


MEDIA_OBJECTS = {"image": ("source", '{"type": "base64", "media_type": ..., "data": ...}'),
                 "document": ("source", '{"type": "base64" | "text" | "url" | ..., ...}'),
                 "input_audio": ("input_audio", '{"data": <base64>, "format": "wav" | "mp3"}')}
"""The media parts whose content is one object, by type: ``(field, what it holds)``. The
provider refuses such a part whose field is not an object; :func:`checked_media_of` does too,
before anything is stored."""


def checked_media_of(content: Any, where: str = "content") -> str:
    """:func:`media_of` of a request's ``content`` (``where``: its place, named in errors), after
    checking each media part's shape: an Anthropic ``image`` or ``document`` block needs a
    ``source`` object, a Chat Completions ``input_audio`` part an ``input_audio`` object
    (:data:`MEDIA_OBJECTS`).

    Raises:
        EventError: naming the part (``content[1]``), its field and what it holds instead.
    """
    if isinstance(content, list):
        for j, part in enumerate(content):
            if isinstance(part, dict) and (spec := MEDIA_OBJECTS.get(str(part.get("type")))) is not None:
                field, shape = spec
                if not isinstance(part.get(field), dict):
                    got = "nothing" if part.get(field) is None else f"a {type(part[field]).__name__}"
                    raise EventError(f"{where}[{j}] ({part['type']}): its {field} must be an object {shape}, got "
                                     f"{got}; fix the part or leave it out")
    return media_of(content)


def check_media(media: str, where: str = "media") -> None:
    """Check a message's :attr:`Message.media` given in its stored form (what :meth:`Message.to_dict`
    writes): a JSON list of :data:`MEDIA_TYPES` parts, each as :func:`checked_media_of` requires.

    Raises:
        EventError: naming the field and what is wrong.
    """
    try:
        parts = json.loads(media) if media else []
    except ValueError as exc:
        raise EventError(f"{where}: not JSON ({exc}); give the JSON list of the message's media parts, or leave it out") from None
    if not isinstance(parts, list) or any(not isinstance(p, dict) or p.get("type") not in MEDIA_TYPES for p in parts):
        raise EventError(f"{where}: must be a JSON list of media parts, each an object whose type is one of "
                         f"{', '.join(MEDIA_TYPES)}")
    checked_media_of(parts, where)


@dataclass(slots=True)
class Trace:
    """One recorded agent run read from a file: its messages in the order the model saw them.

    Attributes:
        source: the reader's format name (e.g. ``"mini-swe-agent"``).
        trace_id: an id unique within the file (instance id, task id + trial, …).
        path: the file it came from.
        messages: chronological messages, OpenAI form, pairing intact.
        meta: reader-specific extras (model, reward, …), never used by policies.
    """

    source: str
    trace_id: str
    path: str
    messages: list[Message]
    meta: dict[str, Any] = field(default_factory=dict)
