"""Reader for Codex CLI session logs (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``, also ``.jsonl.gz``).

Each line is ``{timestamp, type, payload}``; one file is one session, read as one trace. Its id is
the ``session_meta`` payload's ``id`` (else the file name without ``.jsonl``/``.jsonl.gz``).

Line types:
    ``session_meta`` (first line): ``cli_version``, ``cwd`` (the project folder) and ``git.repository_url``
    (as ``repository``) → ``meta``; ``base_instructions``
    (the system prompt Codex sends as the API's ``instructions``) is not a message: only its
    length goes to ``meta["system_prompt_chars"]``.
    ``turn_context`` (one per turn): the ``model`` of the calls that follow; ``meta["model"]`` is
    the most frequent one, ``meta["models"]`` all of them in order of first use.
    ``response_item``: the conversation, the items Codex sends back to the model (below).
    ``event_msg``: the UI's own stream. ``agent_message``/``user_message`` repeat response items
    and are never read as messages; ``token_count`` gives the recorded usage (below);
    ``context_compacted`` marks a compaction (below); every other event is ignored.
    ``compacted``: a compaction (below).

Response items:
    ``message``: role ``user`` (the typed prompt, but also AGENTS.md and ``<environment_context>``
    text), ``developer`` (read as ``system``) or ``assistant``; text parts joined by
    ``content_text``, image/file parts (``input_image`` …) kept whole in ``Message.media``.
    ``function_call`` → a call (``call_id``, ``name``; an MCP tool's ``namespace`` is prefixed
    to its name, as Codex names it; ``arguments`` kept as the recorded JSON string);
    ``custom_tool_call`` (apply_patch) → a call whose ``arguments`` is the free-text ``input`` as
    is (not JSON); ``tool_search_call`` → a ``tool_search`` call (its arguments as JSON);
    ``local_shell_call`` → a ``local_shell`` call (its ``action`` as JSON).
    ``function_call_output`` / ``custom_tool_call_output`` (``output``: a string or a list of
    parts) and ``tool_search_output`` (the tool definitions it loaded, as JSON) → tool results,
    paired with their call by ``call_id``. A command's output keeps the header Codex puts before
    ``Output:`` (chunk id, wall time, exit code, token count): the model saw it; ``write_stdin``
    polls of a running command are ordinary calls with ordinary results.
    ``web_search_call``: the search runs on the provider's side and its results are not in the
    log, but the item stays in the context Codex sends: a ``web_search`` call (its ``action`` as
    JSON) with the result :data:`WEB_SEARCH_RESULT` (``meta["web_search_calls"]``).
    ``reasoning`` (encrypted; a copy scrubbed of secrets may read ``REDACTED``): not a message, but each
    payload is kept unchanged in ``meta["reasoning"]``: the str of the index in ``messages`` of
    the assistant message of the same response → the list of its reasoning payloads.
    Any other item type (``ghost_snapshot``, a bare ``compaction`` …), like any other line type,
    is skipped and counted by type in ``meta["skipped_items"]``.

One model response is ONE assistant message: its items (reasoning, text messages, calls, web
searches, in any order) come one after the other, so consecutive assistant-side items are
merged (texts joined by a blank line, calls in order). A user/developer message, a tool output,
a ``token_count``, a ``turn_context`` or a compaction ends the response; the next assistant-side
item starts a new one. A response with only reasoning is an assistant message with empty text.

Recorded usage, ``meta["usage"]``: Codex writes one ``token_count`` per completed model call,
after the call's items and after the outputs of the tools it ran; ``info.last_token_usage``
is that call's usage and ``info.total_token_usage`` the running sum. A ``token_count`` whose total
equals the previous one repeats it (written again after an interrupted turn) and is dropped
(``meta["usage_duplicates"]``); one with ``info: null`` carries rate limits only. Each other one
belongs to the latest response that has no usage yet: ``{"message", "input": input_tokens -
cached_input_tokens (OpenAI counts cached tokens inside input_tokens), "cache_read":
cached_input_tokens, "cache_write": 0, "cache_write_1h": 0, "output": output_tokens (reasoning
included), "model", "timestamp"}`` (the model of the turn the response belongs to; the time the
usage line was written). A response with no usage (interrupted, or the session's last) is left
out (``meta["responses_without_usage"]``); usage with no response is counted in
``meta["usage_unmatched"]``.

Compactions, ``meta["compactions"]``: a ``compacted`` line replaces the model's context by its
``replacement_history`` (the kept user and developer messages, sometimes a ``compaction`` item
holding the encrypted summary) and adds no message. Recorded as ``{"at": index in ``messages``
of the first message after it (``len(messages)`` if none), "kept": the replacement history as
``Message.to_dict()`` values (developer → system; a ``compaction`` item becomes the user message
``"[compaction summary: N characters, encrypted]"``; other item types are left out), "trigger":
"auto", "pre_tokens": None, "timestamp", "source": "compacted"}``: the agent's context at call
``j >= at`` is ``kept + messages[at:j]``. A line with only a summary ``message`` (older Codex) keeps
that summary as one user message. A ``context_compacted`` event right after (or before) a
``compacted`` line is the same compaction; alone, it is recorded with ``kept: []`` and
``"source": "context_compacted"``.

Errors: a line that is not JSON, or whose fields have the wrong type, is skipped; the rest of the
file is read and its trace yielded, then one TraceFormatError names the first such line and field.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from historygraph.history.events import Message, ToolCall, Trace, media_of
from historygraph.traces._common import (Builder, Draft, TraceFormatError, dumps, epoch, iter_jsonl, lines_error,
                                         feed_lines, file_stem, req, text)

NAME = "codex"
WEB_SEARCH_RESULT = "[web search ran on the provider's side: its results are not in the log]"
_LINE_TYPES = frozenset({"session_meta", "response_item", "turn_context", "event_msg", "compacted"})
_ROLES = {"user": "user", "developer": "system", "system": "system", "assistant": "assistant"}
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output", "tool_search_output"})
_USAGE_KEYS = ("input_tokens", "cached_input_tokens", "output_tokens")


def sniff(obj: Any) -> bool:
    """A rollout line: ``{timestamp, type, payload}`` with a Codex line type and an object payload."""
    return (isinstance(obj, dict) and "timestamp" in obj and obj.get("type") in _LINE_TYPES
            and isinstance(obj.get("payload"), dict))


def read(path: str | Path, obj: Any = None) -> Iterator[Trace]:
    """Yield the file's one trace (``obj`` is unused: the file is read line by line). Lines that
    cannot be read are skipped; once the trace is yielded, one TraceFormatError names them."""
    path = Path(path)
    errors: list[TraceFormatError] = []
    r = _Reader(path)
    done = feed_lines(iter_jsonl(path, NAME, errors), r.line, errors)
    if done == 0 and not errors:
        raise TraceFormatError(path, NAME, None, "empty file")
    yield r.trace()
    if errors:
        raise lines_error(errors, done)


class _Reader:
    """State of one file's pass (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.b = Builder(path, NAME, file_stem(path))
        self.meta: dict[str, Any] = {"cli_version": None, "system_prompt_chars": None}
        self.models: Counter[str] = Counter()
        self.model: str | None = None
        self.resp: int | None = None  # draft index of the response still open for more items
        self.awaiting: int | None = None  # draft index of the latest response without usage
        self.responses: dict[int, dict[str, Any]] = {}  # draft index -> {"reasoning", "usage", "model"}
        self.media: dict[int, str] = {}  # draft index -> Message.media
        self.names: dict[str, str] = {}  # call id -> tool name
        self.compactions: list[dict[str, Any]] = []
        self.last_total: str | None = None
        self.skipped: Counter[str] = Counter()
        self.counts = {"responses_without_usage": 0, "usage_duplicates": 0, "usage_unmatched": 0,
                       "web_search_calls": 0, "tool_search_calls": 0}
        self.seen_meta = False

    # ------------------------------------------------------------------ lines
    def line(self, n: int, rec: Any) -> None:
        w = f"line {n}"
        kind = req(rec, "type", str, w, self.b)
        if kind not in _LINE_TYPES:
            self.skipped[kind] += 1
            return
        p = req(rec, "payload", dict, w, self.b)
        ts, pw = epoch(rec.get("timestamp")), f"{w}.payload"
        if kind == "session_meta":
            self._session(p, pw)
        elif kind == "turn_context":
            model = p.get("model")
            if model is not None and not isinstance(model, str):
                raise self.b.err(f"{pw}.model", f"expected str, got {type(model).__name__}")
            if model:
                self.model = model
                self.models[model] += 1
            self.resp = None
        elif kind == "response_item":
            self._item(p, pw, ts, n)
        elif kind == "event_msg":
            event = req(p, "type", str, pw, self.b)
            if event == "token_count":
                self._usage(p, pw, ts)
            elif event == "context_compacted":
                self._compaction(ts, None)
        else:
            self._compaction(ts, self._kept(p, pw))

    def _session(self, p: dict, pw: str) -> None:
        if self.seen_meta:  # a resumed or forked session repeats it: the first one names the trace
            return
        self.seen_meta = True
        for key in ("id", "cli_version"):
            if p.get(key) is not None and not isinstance(p[key], str):
                raise self.b.err(f"{pw}.{key}", f"expected str, got {type(p[key]).__name__}")
        if p.get("id"):
            self.b.trace_id = p["id"]
        self.meta["cli_version"] = p.get("cli_version")
        if isinstance(p.get("cwd"), str):
            self.meta["cwd"] = p["cwd"]
        git = p.get("git")
        if isinstance(git, dict) and isinstance(git.get("repository_url"), str):
            self.meta["repository"] = git["repository_url"]
        base = p.get("base_instructions")
        body = base.get("text") if isinstance(base, dict) else base
        if body is not None and not isinstance(body, str):
            raise self.b.err(f"{pw}.base_instructions", f"expected text, got {type(body).__name__}")
        self.meta["system_prompt_chars"] = None if body is None else len(body)

    def _item(self, p: dict, pw: str, ts: float | None, n: int) -> None:
        b = self.b
        t = req(p, "type", str, pw, b)
        if t == "message":
            role = req(p, "role", str, pw, b)
            if role not in _ROLES:
                raise b.err(f"{pw}.role", f"unknown role {role!r}")
            body = text(b, p.get("content"), f"{pw}.content")
            if role == "assistant":
                d = self.b.drafts[self._response(ts, pw)]
                d.content = f"{d.content}\n\n{body}" if d.content and body else d.content or body
            else:
                self.resp = None
                self._add(Draft(_ROLES[role], body, timestamp=ts, where=pw), p.get("content"))
        elif t == "reasoning":
            self.responses[self._response(ts, pw)]["reasoning"].append(p)
        elif t == "function_call":
            name = req(p, "name", str, pw, b)
            ns = p.get("namespace")
            if ns is not None and not isinstance(ns, str):
                raise b.err(f"{pw}.namespace", f"expected str, got {type(ns).__name__}")
            self._call(ts, pw, req(p, "call_id", str, pw, b), (ns or "") + name, req(p, "arguments", str, pw, b))
        elif t == "custom_tool_call":
            self._call(ts, pw, req(p, "call_id", str, pw, b), req(p, "name", str, pw, b), req(p, "input", str, pw, b))
        elif t == "tool_search_call":
            args = p.get("arguments")
            self.counts["tool_search_calls"] += 1
            self._call(ts, pw, req(p, "call_id", str, pw, b), "tool_search",
                       args if isinstance(args, str) else dumps(args if args is not None else {}))
        elif t == "local_shell_call":
            cid = p.get("call_id") or p.get("id") or f"local_shell@line{n}"
            self._call(ts, pw, str(cid), "local_shell", dumps(p.get("action") or {}))
        elif t == "web_search_call":
            wid = p.get("id")
            cid = wid if isinstance(wid, str) and wid else f"web_search@line{n}"
            self.counts["web_search_calls"] += 1
            self._call(ts, pw, cid, "web_search", dumps(p.get("action") or {}))
            # the synthesized result does not end the response: the search ran inside it
            b.add(Draft("tool", WEB_SEARCH_RESULT, tool_call_id=cid, name="web_search", timestamp=ts, where=pw))
        elif t in _OUTPUTS:
            cid = req(p, "call_id", str, pw, b)
            if t == "tool_search_output":
                content: Any = None
                body = dumps(p.get("tools") if p.get("tools") is not None else [])
            else:
                content = req(p, "output", (str, list), pw, b)
                body = text(b, content, f"{pw}.output")
            self.resp = None
            self._add(Draft("tool", body, tool_call_id=cid, name=self.names.get(cid), timestamp=ts, where=pw), content)
        else:
            self.skipped[t] += 1

    def _add(self, d: Draft, content: Any) -> None:
        self.b.add(d)
        media = media_of(content)
        if media:
            self.media[len(self.b.drafts) - 1] = media

    def _response(self, ts: float | None, where: str) -> int:
        """The draft index of the open response's assistant message, or of a new one."""
        if self.resp is None:
            if self.awaiting is not None:
                self.counts["responses_without_usage"] += 1
            self.b.add(Draft("assistant", "", timestamp=ts, where=where))
            self.resp = self.awaiting = len(self.b.drafts) - 1
            self.responses[self.resp] = {"reasoning": [], "usage": None, "model": self.model}
        return self.resp

    def _call(self, ts: float | None, where: str, cid: str, name: str, arguments: str) -> None:
        self.b.drafts[self._response(ts, where)].calls.append(ToolCall(cid, name, arguments))
        self.names[cid] = name

    def _usage(self, p: dict, pw: str, ts: float | None) -> None:
        info = p.get("info")
        if info is None:  # rate limits only
            return
        if not isinstance(info, dict):
            raise self.b.err(f"{pw}.info", f"expected an object, got {type(info).__name__}")
        last = req(info, "last_token_usage", dict, f"{pw}.info", self.b)
        got = {}
        for field in _USAGE_KEYS:
            v = last.get(field, 0)
            if not isinstance(v, int) or isinstance(v, bool):
                raise self.b.err(f"{pw}.info.last_token_usage.{field}", f"expected int, got {type(v).__name__}")
            got[field] = v
        total = info.get("total_token_usage")
        key = json.dumps(total, sort_keys=True) if total is not None else None
        if key is not None and key == self.last_total:
            self.counts["usage_duplicates"] += 1
            return
        self.last_total = key
        self.resp = None
        if self.awaiting is None:
            self.counts["usage_unmatched"] += 1
            return
        r = self.responses[self.awaiting]
        r["usage"] = {"input": got["input_tokens"] - got["cached_input_tokens"], "cache_read": got["cached_input_tokens"],
                      "cache_write": 0, "cache_write_1h": 0, "output": got["output_tokens"], "model": r["model"],
                      "timestamp": ts}
        self.awaiting = None

    # ------------------------------------------------------------ compaction
    def _kept(self, p: dict, pw: str) -> list[dict]:
        hist = p.get("replacement_history")
        if hist is None:
            summary = p.get("message")
            if summary is not None and not isinstance(summary, str):
                raise self.b.err(f"{pw}.message", f"expected str, got {type(summary).__name__}")
            return [Message("user", summary).to_dict()] if summary else []
        if not isinstance(hist, list):
            raise self.b.err(f"{pw}.replacement_history", f"expected a list, got {type(hist).__name__}")
        kept = []
        for i, item in enumerate(hist):
            w = f"{pw}.replacement_history[{i}]"
            t = req(item, "type", str, w, self.b)
            if t == "message":
                role = req(item, "role", str, w, self.b)
                if role not in _ROLES:
                    raise self.b.err(f"{w}.role", f"unknown role {role!r}")
                content = item.get("content")
                kept.append(Message(_ROLES[role], text(self.b, content, f"{w}.content"),
                                    media=media_of(content)).to_dict())
            elif t == "compaction":
                enc = item.get("encrypted_content")
                size = len(enc) if isinstance(enc, str) else 0
                kept.append(Message("user", f"[compaction summary: {size} characters, encrypted]").to_dict())
        return kept

    def _compaction(self, ts: float | None, kept: list[dict] | None) -> None:
        """A ``compacted`` line (``kept`` given) or a ``context_compacted`` event (``None``)."""
        self.resp = None
        k = len(self.b.drafts)
        prev = self.compactions[-1] if self.compactions else None
        if prev is not None and prev["at"] == k:  # the line and the event of one compaction
            if kept is not None and prev["source"] == "context_compacted":
                prev.update(kept=kept, source="compacted", timestamp=ts)
            return
        self.compactions.append({"at": k, "kept": kept or [], "trigger": "auto", "pre_tokens": None,
                                 "timestamp": ts, "source": "compacted" if kept is not None else "context_compacted"})

    # ------------------------------------------------------------------ trace
    def trace(self) -> Trace:
        drafts = self.b.drafts
        stamps = [d.timestamp for d in drafts]
        for i, d in enumerate(drafts):  # each message's timestamp names its draft (synthetic: None)
            d.timestamp = float(i)
        msgs, stats = self.b.finish()
        src = [None if m.timestamp is None else int(m.timestamp) for m in msgs]
        pos = {s: j for j, s in enumerate(src) if s is not None}
        messages = [replace(m, timestamp=None if s is None else stamps[s], media=self.media.get(s, "") if s is not None else "")
                    for m, s in zip(msgs, src)]
        reasoning, usage = {}, []
        for i, r in self.responses.items():
            if r["reasoning"]:
                reasoning[str(pos[i])] = r["reasoning"]
            if r["usage"] is not None:
                usage.append({"message": pos[i], **r["usage"]})
        if self.awaiting is not None:
            self.counts["responses_without_usage"] += 1
        compactions = []
        for c in self.compactions:
            after = [pos[i] for i in range(c["at"], len(drafts)) if messages[pos[i]].role != "tool"]
            compactions.append({**c, "at": after[0] if after else len(messages)})
        models = list(self.models)
        meta = {**self.meta, "model": self.models.most_common(1)[0][0] if self.models else None, "models": models,
                "reasoning": reasoning, "usage": usage, "compactions": compactions,
                "skipped_items": dict(self.skipped), **self.counts, **stats}
        return Trace(source=NAME, trace_id=self.b.trace_id, path=self.b.path, messages=messages, meta=meta)
