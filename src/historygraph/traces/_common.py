"""Helpers shared by the trace readers: errors, JSON loading, and the pairing pass.

Every reader builds a list of mutable :class:`Draft` messages in recorded order and hands it to
:class:`Builder`, which enforces the pairing guarantee of ``formats/__init__.py`` and turns the
drafts into immutable :class:`historygraph.history.events.Message` values:

* duplicate call ids within one trace become unique (``id#2``, ``id#3`` …); tool results are
  remapped in order (the n-th result carrying ``id`` answers the n-th unanswered call ``id``);
* the results of an assistant message are moved right after it, in call order;
* a call without a result gets a synthetic ``"[no result was recorded for this call]"`` result,
  unless it belongs to the trace's final assistant message (the run ended there);
* a result whose call is missing becomes a user message prefixed
  ``"[tool result without a recorded call] "``.

The counts go into ``Trace.meta`` (``synthetic_results``, ``orphan_results``,
``renamed_call_ids``, ``unanswered_final_calls``).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from historygraph.history.events import EventError, Message, ToolCall, content_text

NO_RESULT = "[no result was recorded for this call]"
ORPHAN_PREFIX = "[tool result without a recorded call] "


class TraceFormatError(ValueError):
    """A trace file that cannot be read: names the file, the format tried and the field (``None``
    when the file as a whole is at fault: not JSON, empty)."""

    def __init__(self, path: str | Path, format: str, field: str | None, what: str) -> None:
        self.path = str(path)
        self.format = format
        self.field = field
        self.what = what
        where = f" field {field}:" if field is not None else ""
        super().__init__(f"{self.path}: format {format}:{where} {what}")


@dataclass
class Draft:
    """A message under construction (mutable, unvalidated); ``where`` names its source field."""

    role: str
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    timestamp: float | None = None
    where: str = ""


class Builder:
    """Collects drafts for one trace and produces paired ``Message`` values (see module doc)."""

    def __init__(self, path: str | Path, fmt: str, trace_id: str) -> None:
        self.path, self.fmt, self.trace_id = str(path), fmt, trace_id
        self.drafts: list[Draft] = []
        self.orphans = 0

    def err(self, where: str, what: str) -> TraceFormatError:
        return TraceFormatError(self.path, self.fmt, where, what)

    def add(self, draft: Draft) -> Draft:
        self.drafts.append(draft)
        return draft

    def orphan(self, content: str, timestamp: float | None = None, where: str = "") -> None:
        """A tool result that has no call it could answer: kept as a marked user message."""
        self.orphans += 1
        self.add(Draft("user", ORPHAN_PREFIX + content, timestamp=timestamp, where=where))

    def finish(self) -> tuple[list[Message], dict[str, int]]:
        drafts = self.drafts
        used: set[str] = set()
        seen: dict[str, int] = defaultdict(int)
        pending: dict[str, deque[str]] = defaultdict(deque)
        results: dict[str, Draft] = {}
        matched: set[int] = set()
        renamed = 0
        for d in drafts:
            if d.role == "assistant" and d.calls:
                new_calls = []
                for c in d.calls:
                    seen[c.id] += 1
                    n, new_id = seen[c.id], c.id
                    if n > 1:
                        new_id = f"{c.id}#{n}"
                    while new_id in used:  # a recorded id may itself look like "x#2"
                        n += 1
                        new_id = f"{c.id}#{n}"
                    used.add(new_id)
                    pending[c.id].append(new_id)
                    if new_id != c.id:
                        renamed += 1
                        c = ToolCall(id=new_id, name=c.name, arguments=c.arguments)
                    new_calls.append(c)
                d.calls = new_calls
            elif d.role == "tool":
                queue = pending.get(d.tool_call_id or "")
                if queue:
                    call_id = queue.popleft()
                    d.tool_call_id = call_id
                    results[call_id] = d
                    matched.add(id(d))
        last_assistant = max((i for i, d in enumerate(drafts) if d.role == "assistant"), default=-1)
        out: list[Draft] = []
        synthetic = unanswered = 0
        orphans = self.orphans
        for i, d in enumerate(drafts):
            if d.role == "tool":
                if id(d) not in matched:
                    orphans += 1
                    out.append(Draft("user", ORPHAN_PREFIX + d.content, timestamp=d.timestamp, where=d.where))
                continue
            out.append(d)
            for c in d.calls:
                if c.id in results:
                    out.append(results[c.id])
                elif i == last_assistant:
                    unanswered += 1
                else:
                    synthetic += 1
                    out.append(Draft("tool", NO_RESULT, tool_call_id=c.id, name=c.name, where=d.where))
        messages = []
        for d in out:
            try:
                messages.append(
                    Message(role=d.role, content=d.content, tool_calls=tuple(d.calls), tool_call_id=d.tool_call_id,
                            name=d.name, timestamp=d.timestamp)
                )
            except EventError as e:
                raise self.err(d.where or "(message)", str(e)) from None
        stats = {"synthetic_results": synthetic, "orphan_results": orphans, "renamed_call_ids": renamed,
                 "unanswered_final_calls": unanswered}
        return messages, stats


# --------------------------------------------------------------------------- loading helpers

def open_text(path: str | Path):  # noqa: ANN201 (a text file object)
    """Open a trace file for reading as UTF-8 text; a name ending in ``.gz`` is read through gzip
    (Claude Code and Codex logs are often kept compressed as ``.jsonl.gz``)."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def load_json(path: str | Path, fmt: str) -> Any:
    """Parse a whole JSON file (plain or ``.gz``), or raise TraceFormatError naming the file."""
    try:
        with open_text(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, gzip.BadGzipFile, EOFError) as e:
        raise TraceFormatError(path, fmt, None, f"not valid JSON: {e}") from None


_DECODER = json.JSONDecoder()


def decode_line(line: str) -> list[Any]:
    """The JSON values on one line, in order: usually one, but a writer that lost a newline leaves
    two objects back to back (seen in a real Claude Code log), and both are kept. Raises
    ``json.JSONDecodeError`` for text that is not a sequence of JSON values."""
    out: list[Any] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i].isspace():
            i += 1
        if i >= n:
            return out
        obj, i = _DECODER.raw_decode(line, i)
        out.append(obj)


def iter_jsonl(path: str | Path, fmt: str, errors: list[TraceFormatError]) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, parsed_object)`` for each JSON object of a JSONL file (plain or ``.gz``;
    a line holding several objects back to back yields each, with the same line number); a line
    that is not valid JSON is appended to ``errors`` (a TraceFormatError naming it) and skipped."""
    n = 0
    try:
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        objs = decode_line(line)
                    except json.JSONDecodeError as e:
                        errors.append(TraceFormatError(path, fmt, f"line {n}", f"not valid JSON: {e}"))
                        continue
                    for obj in objs:
                        yield n, obj
    except (gzip.BadGzipFile, EOFError, UnicodeDecodeError) as e:  # a truncated .gz, bytes that are not UTF-8
        if n == 0:  # not a gzip file at all, or not text
            errors.append(TraceFormatError(path, fmt, None, f"cannot be read: {e}"))
        else:
            errors.append(TraceFormatError(path, fmt, f"line {n + 1} to the end", f"cannot be read ({e}); a file cut short "
                                           "(copied while the agent wrote it?) is read up to there"))


def feed_lines(lines: Iterable[tuple[int, Any]], handle: Callable[[int, Any], None],
               errors: list[TraceFormatError]) -> int:
    """Hand each ``(line_number, object)`` of ``lines`` (e.g. :func:`iter_jsonl`'s) to ``handle``; a
    line ``handle`` refuses with TraceFormatError is appended to ``errors`` and the rest still read.
    Returns how many lines were handled: the readers of one-trace-per-file logs (Claude Code, Codex)
    yield their trace, then raise :func:`lines_error` for the lines they skipped."""
    done = 0
    for n, obj in lines:
        try:
            handle(n, obj)
        except TraceFormatError as e:
            errors.append(e)
            continue
        done += 1
    return done


def file_stem(path: str | Path) -> str:
    """The file name without its trace suffix (``.jsonl``, ``.json``, either ``.gz``), as a trace id
    when the file names none."""
    name = Path(path).name
    for suffix in (".jsonl.gz", ".jsonl", ".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def lines_error(errors: list[TraceFormatError], read: int) -> TraceFormatError:
    """One TraceFormatError for the unreadable lines of a JSONL file (``errors``, in file order), raised
    once its ``read`` readable lines were yielded: the first one's field, and how many were read."""
    first = errors[0]
    more = f"; also {', '.join(e.field or '' for e in errors[1:])}" if len(errors) > 1 else ""
    return TraceFormatError(first.path, first.format, first.field,
                            f"{first.what}{more} (the file's other {read} line(s) were read)")


def req(obj: Any, key: str, types: type | tuple[type, ...], where: str, b: Builder | None = None,
        path: str | Path = "", fmt: str = "") -> Any:
    """``obj[key]``, which must exist and be of ``types``; else TraceFormatError at ``where.key``."""
    name = f"{where}.{key}" if where else key
    err = b.err if b is not None else (lambda w, m: TraceFormatError(path, fmt, w, m))
    if not isinstance(obj, dict):
        raise err(where or "(top level)", f"expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise err(name, "is missing")
    value = obj[key]
    if not isinstance(value, types):
        want = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise err(name, f"expected {want}, got {type(value).__name__}")
    return value


def text(b: Builder, value: Any, where: str) -> str:
    """``content_text`` with errors reported as TraceFormatError at ``where``."""
    try:
        return content_text(value)
    except EventError as e:
        raise b.err(where, str(e)) from None


def tool_call(b: Builder, data: Any, where: str) -> ToolCall:
    """``ToolCall.from_openai`` (nested or flat form) with errors reported at ``where``."""
    try:
        return ToolCall.from_openai(data)
    except EventError as e:
        raise b.err(where, str(e)) from None


def epoch(value: Any) -> float | None:
    """Seconds since the epoch from a number or an ISO-8601 string (naive times are taken as UTC)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value:
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    return None


def dumps(obj: Any) -> str:
    """Compact JSON text for tool-call arguments (non-ASCII kept)."""
    return json.dumps(obj, ensure_ascii=False)


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]…`` for optional metadata; ``None`` as soon as a step is missing or not an object."""
    for k in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(k)
    return obj


def openai_message(b: Builder, m: Any, w: str) -> Draft:
    """A draft from one OpenAI chat message ``m`` at location ``w`` (role, content, tool_calls,
    tool_call_id, name); raises :class:`TraceFormatError` naming the field that is wrong."""
    role = req(m, "role", str, w, b)
    d = Draft(role, text(b, m.get("content"), f"{w}.content"), where=w)
    if role == "assistant":
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise b.err(f"{w}.tool_calls", f"expected a list, got {type(calls).__name__}")
        d.calls = [tool_call(b, c, f"{w}.tool_calls[{k}]") for k, c in enumerate(calls)]
    elif role == "tool":
        d.tool_call_id = str(req(m, "tool_call_id", str, w, b))
        d.name = m.get("name") if isinstance(m.get("name"), str) else None
    elif role not in ("system", "user"):
        raise b.err(f"{w}.role", f"unknown role {role!r}")
    return d
