"""Trace readers: turn recorded agent runs into :class:`historygraph.history.events.Trace` values.

Each supported format has a small module exposing ``NAME``, ``sniff(obj)`` (cheap detection on
the parsed JSON, or on the first line of a JSONL file) and ``read(path, obj=None)`` (an iterator
of traces). The formats and their fields are described in each reader's module docstring.

Every reader produces OpenAI-form messages (what the model saw: raw API copies, costs and usage
are ignored) and guarantees pairing: each assistant tool call is answered by exactly one tool
message placed right after that assistant message (calls of the trace's final assistant message
may stay unanswered: the run ended there), and each tool message answers a call. Repairs are
counted in ``Trace.meta``: ``synthetic_results`` (a call without a recorded result got
``"[no result was recorded for this call]"``), ``orphan_results`` (a result without a call became a
user message prefixed ``"[tool result without a recorded call] "``), ``renamed_call_ids``
(duplicate call ids suffixed ``#2``, ``#3`` …) and ``unanswered_final_calls``.

Public API: :data:`READERS`, :func:`detect_format`, :func:`read_traces`,
:func:`list_trace_files`, :class:`TraceFormatError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from historygraph.history.events import Trace

from historygraph.traces import claude_code, codex, mini_swe_agent, openai_chat, openhands, swe_agent, tau2_bench, tau_bench
from historygraph.traces._common import TraceFormatError, decode_line, load_json, open_text

__all__ = ["READERS", "TraceFormatError", "detect_format", "list_trace_files", "read_traces"]

#: format name -> reader module (``NAME``, ``sniff``, ``read``), in detection order.
READERS: dict[str, ModuleType] = {
    m.NAME: m for m in (mini_swe_agent, swe_agent, openhands, tau_bench, tau2_bench, codex, claude_code, openai_chat)
}

_SUFFIXES = (".json", ".jsonl", ".traj", ".json.gz", ".jsonl.gz")  # ".traj.json" ends with ".json"


def is_jsonl(path: Path) -> bool:
    """A JSON Lines file: ``*.jsonl`` or ``*.jsonl.gz``."""
    return path.name.endswith((".jsonl", ".jsonl.gz"))


def _is_trace_file(p: Path) -> bool:
    return p.is_file() and p.name.endswith(_SUFFIXES) and not p.name.startswith(".")


def list_trace_files(path: str | Path) -> list[Path]:
    """The trace files under ``path``: the file itself, or every ``*.json``, ``*.jsonl``,
    ``*.traj``, ``*.traj.json``, ``*.json.gz`` and ``*.jsonl.gz`` below a directory (recursively,
    sorted; others are skipped). A folder laid out as ``~/.claude/projects`` or ``~/.codex/sessions``
    is such a directory."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such file or directory")
    return sorted((f for f in p.rglob("*") if _is_trace_file(f)
                   and not any(part.startswith(".") for part in f.relative_to(p).parts)),
                  key=lambda f: f.relative_to(p).as_posix())


def _probe(path: Path) -> Any:
    """What ``sniff`` looks at: the first JSON object of a ``.jsonl`` (or ``.jsonl.gz``) file, else
    the whole JSON."""
    if not is_jsonl(path):
        return load_json(path, "unknown")
    try:
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        return decode_line(line)[0]
                    except json.JSONDecodeError as e:
                        raise TraceFormatError(path, "unknown", f"line {n}", f"not valid JSON: {e}") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError
        raise TraceFormatError(path, "unknown", None, f"cannot be read: {e}") from None
    raise TraceFormatError(path, "unknown", None, "empty file")


def _detect(path: Path, probe: Any) -> str:
    for name, mod in READERS.items():
        if mod.sniff(probe):
            return name
    raise TraceFormatError(path, "unknown", "(top level)",
                           f"does not match any known trace format (tried: {', '.join(READERS)}); a chat "
                           f"transcript of your own is read as {{\"format\": \"openai-chat\", \"messages\": [...]}}")


def detect_format(path: str | Path) -> str:
    """The name of the format of the trace file ``path``; TraceFormatError if none matches."""
    p = Path(path)
    return _detect(p, _probe(p))


def _read_file(path: Path, format: str | None) -> Iterator[Trace]:
    if format is not None:
        if format not in READERS:
            raise TraceFormatError(path, format, "(format)", f"unknown format name; known: {', '.join(READERS)}")
        try:
            yield from READERS[format].read(path)
        except TraceFormatError as e:  # say so when the file is of another format than the one forced
            try:
                other = detect_format(path)
            except TraceFormatError:
                raise e from None
            if other == format:
                raise
            raise TraceFormatError(e.path, e.format, e.field, f"{e.what} (the file reads as format {other}: "
                                   f"leave the format out, or give {other})") from None
        return
    probe = _probe(path)
    name = _detect(path, probe)
    # A whole-file probe is the parsed file: hand it over instead of parsing it twice.
    yield from READERS[name].read(path, None if is_jsonl(path) else probe)


def read_traces(path: str | Path, format: str | None = None) -> Iterator[Trace]:
    """Every trace in ``path`` (a file, or a directory walked as in :func:`list_trace_files`).

    ``format`` forces one reader for every file; by default each file's format is detected.

    Raises:
        TraceFormatError: a file that is not valid JSON, matches no format, or lacks a required
            field / has one of the wrong type (the message names file, format and field).
    """
    for f in list_trace_files(path):
        yield from _read_file(f, format)
