"""Reader for Claude Code session logs: ``~/.claude/projects/<project>/<session>.jsonl`` (or ``.jsonl.gz``).

One file is one session and one trace (trace id = the lines' ``sessionId``, else the file name
without ``.jsonl``/``.jsonl.gz``). Each line is a JSON object with a ``type``; a line that holds
two objects back to back (a writer that lost a newline) is read as two lines.

Read: ``user`` and ``assistant`` lines, in file order; their ``message`` is the Anthropic Messages
API message the model saw or wrote.
    Assistant: a reply streamed from the API is written as several lines, one content block each,
    sharing ``message.id``; they become ONE assistant message, merged by ``message.id`` (not by
    adjacency: the results of parallel calls are written between them). ``text`` blocks make the
    content; ``tool_use`` blocks the calls (arguments = ``input`` as JSON); ``thinking`` and
    ``redacted_thinking`` blocks are left out of the message and kept whole in
    ``meta["reasoning"]`` (index of the message in ``trace.messages`` as a string -> the blocks);
    other block types are counted in ``meta["ignored_blocks"]``.
    User: each ``tool_result`` block of ``message.content`` becomes a tool message answering its
    ``tool_use_id``; its ``content`` (text, or a list of text and image blocks) is what the model
    saw; ``is_error`` results are kept as they are, and so is a ``<persisted-output>`` preview (the
    model saw only the preview). Images and documents go to ``Message.media``. The line's
    ``toolUseResult`` (the tool's own structured copy, often far larger) is never read. The other
    blocks of a user line (text, images) make a user message after its results.
    Recorded usage: ``meta["usage"]`` holds one entry per assistant message, in order:
    ``{message, input, cache_read, cache_write, cache_write_1h, output, model, timestamp}``. Every
    line of one ``message.id`` repeats the usage, with differing ``output_tokens``: the largest
    value of each number is taken, never the sum.
Compaction: a ``system`` line with ``subtype: compact_boundary`` (``compactMetadata.trigger``,
    ``.preTokens``) and the next user line with ``isCompactSummary: true`` (the summary the agent
    continued from). The summary is not a message; ``meta["compactions"]`` lists
    ``{at, kept, trigger, pre_tokens, timestamp}``: ``at`` is the index in ``trace.messages`` of the
    first message after the compaction (``len(messages)`` when none follows) and ``kept`` the
    summary as a user message (``Message.to_dict``). The context sent at assistant message ``j >=
    at`` (before any later compaction) is ``kept + messages[at:j]``. The earlier lines stay in
    the file (it is append-only) but were no longer in the model's context.
Skipped (counted in ``meta["skipped_lines"]`` by kind): ``progress`` (streamed command output,
    hook runs, subagent traffic), other ``system`` lines (hook summaries, turn durations),
    ``file-history-snapshot``, ``queue-operation`` (prompts typed while the agent was busy),
    ``summary`` (session titles), ``pr-link`` and any other type; ``isSidechain`` lines;
    assistant lines of model ``<synthetic>`` (written by the client: API errors, "No response
    requested."); user lines with ``isMeta: true`` made only of tags ("meta": the
    ``<local-command-caveat>``); user text made only of the tags of local commands (``/exit``,
    ``/ide``, ``/compact``…), ``<command-name>``, ``<command-message>``, ``<command-args>``,
    ``<local-command-stdout>``/``-stderr``/``-caveat`` and ``<system-reminder>`` ("command");
    empty user lines ("empty"); and a line whose ``uuid`` was already read ("duplicate_uuid": a
    resumed client rewrote it). Bash-mode text (``<bash-input>``, ``<bash-stdout>``), task
    notifications and "[Request interrupted by user]" are kept: they are the user's turns.
Prompt commands and skills: a slash command that expands into a prompt (a custom command, a
    skill) is written as its tag line followed by an ``isMeta`` line, child of it (``parentUuid``),
    holding the body with the arguments; the two make ONE user message (the tags, a newline, the
    body), at the tag line's time, as Claude Code sends them. A skill the model loads with the
    ``Skill`` tool is an ``isMeta`` line after the tool's result: a user message of its own. In the
    40 sessions studied (17 command bodies, 11 skill bodies) the billed input grew across each body
    by about its size (the ``/github-pr-review`` body is 1,280 o200k tokens; the billed input of
    the calls before and after it differs by 1,467 to 1,469 tokens the three times the reply
    before it was under 20 tokens). 4 sessions open with a command: with the body, the first call
    of 58e50d6c (version 2.1.30) leaves 42,908 tokens for the system prompt and tools
    (:func:`historygraph.eval.recorded.fixed_tokens`), beside 43,001 for the other 2.1.30
    session; without it, 44,213. The caveat and local commands' lines (a few dozen tokens each)
    could not be told apart in the billed input; they stay skipped.
Resumes and rewinds: lines form a tree through ``uuid``/``parentUuid`` (a compaction boundary has
    no parent, only a ``logicalParentUuid``, which may name a line not in the file). In the 40
    sessions studied (Claude Code 2.0.76 to 2.1.42) no rewind abandoned a branch of conversation:
    the only conversation lines sharing a parent (apart from parallel calls and their results) came
    from resuming after ``/exit``, where the exit command's lines, or once a reply cut short by the
    exit (thinking only), sit beside the client's synthetic "No response requested." line. So the
    tree is not walked: lines are read in file order, a reply cut short stays as it was recorded
    (an assistant message without text), and a line written again on resume is read once.
Ignored fields: ``toolUseResult``, ``requestId``, ``slug``, ``gitBranch``, ``todos``,
    ``thinkingMetadata``, ``permissionMode``; ``meta`` keeps ``model`` (the most common),
    ``agent_version`` (the last ``version``), ``cwd`` (the first) and the pairing counts.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from historygraph.history.events import Message, ToolCall, Trace, media_of

from historygraph.traces._common import (ORPHAN_PREFIX, Builder, Draft, TraceFormatError, dig, dumps, epoch,
                                          feed_lines, file_stem, iter_jsonl, lines_error, req, text)

NAME = "claude-code"

_TYPES = frozenset({"user", "assistant", "system", "progress", "file-history-snapshot", "queue-operation",
                    "summary", "pr-link"})
_IDS = ("sessionId", "uuid", "messageId", "leafUuid")
_REASONING = frozenset({"thinking", "redacted_thinking"})
_WRAPPER = re.compile(r"\s*(?:<(command-name|command-message|command-args|local-command-stdout|local-command-stderr|"
                      r"local-command-caveat|system-reminder)>.*?</\1>\s*)+", re.DOTALL)
_USAGE = (("input", "input_tokens"), ("cache_read", "cache_read_input_tokens"),
          ("cache_write", "cache_creation_input_tokens"), ("output", "output_tokens"))


def sniff(obj: Any) -> bool:
    """A JSON object whose ``type`` is a Claude Code line type and that carries one of its ids
    (``sessionId``, ``uuid``, ``messageId``, ``leafUuid``)."""
    return isinstance(obj, dict) and obj.get("type") in _TYPES and any(k in obj for k in _IDS)


def read(path: str | Path, obj: Any = None) -> Iterator[Trace]:
    """Yield the one trace of the session file ``path`` (``obj``: a single already parsed line, for
    a ``.json`` file). A line that cannot be read is skipped; after the trace is yielded, one
    TraceFormatError names every such line."""
    path = Path(path)
    errors: list[TraceFormatError] = []
    session = _Session(path)
    done = feed_lines(iter_jsonl(path, NAME, errors) if obj is None else iter([(1, obj)]), session.line, errors)
    if done or not errors:  # a file none of whose lines could be read yields nothing
        yield session.trace()
    if errors:
        raise lines_error(errors, done)


@dataclass
class _Reply:
    """One assistant message under construction (all the lines of one ``message.id``)."""

    draft: Draft
    texts: list[dict] = field(default_factory=list)
    reasoning: list[dict] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None


@dataclass
class _Command:
    """A user line made only of command tags (``<command-name>`` …) held back until the next line
    shows whether it is a prompt command (its expanded body follows) or a local one."""

    uuid: str
    blocks: list[dict]
    timestamp: float | None
    where: str


@dataclass
class _Compaction:
    trigger: Any
    pre_tokens: Any
    timestamp: float | None
    first_draft: int  # number of drafts when it happened: the next one is the first after it
    kept: list[dict] = field(default_factory=list)


class _Session:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.b = Builder(path, NAME, file_stem(path))
        self.session_id: str | None = None
        self.version: str | None = None
        self.cwd: str | None = None
        self.uuids: set[str] = set()
        self.replies: dict[str, _Reply] = {}
        self.media: dict[int, str] = {}  # id(draft) -> Message.media
        self.call_names: dict[str, str] = {}
        self.compactions: list[_Compaction] = []
        self.command: _Command | None = None
        self.skipped: Counter[str] = Counter()
        self.ignored_blocks: Counter[str] = Counter()

    def err(self, where: str, what: str) -> TraceFormatError:
        return TraceFormatError(self.path, NAME, where, what)

    # ------------------------------------------------------------------ one line

    def line(self, n: int, rec: Any) -> None:
        w = f"line {n}"
        if not isinstance(rec, dict):
            raise self.err(w, f"expected an object, got {type(rec).__name__}")
        uuid = rec.get("uuid")
        if isinstance(uuid, str) and uuid in self.uuids:
            self.skipped["duplicate_uuid"] += 1
            return
        kind = rec.get("type")
        ts = epoch(rec.get("timestamp"))
        if self.command is not None and kind in ("user", "assistant") and not (
                rec.get("isMeta") is True and rec.get("parentUuid") == self.command.uuid):
            self._drop_command()
        if rec.get("isSidechain") is True:
            self.skipped["sidechain"] += 1
        elif kind == "assistant":
            self._assistant(rec, w, ts)
        elif kind == "user":
            self._user(rec, w, ts)
        elif kind == "system" and rec.get("subtype") == "compact_boundary":
            self.compactions.append(_Compaction(dig(rec, "compactMetadata", "trigger"),
                                                dig(rec, "compactMetadata", "preTokens"), ts, len(self.b.drafts)))
        else:
            self.skipped[str(kind)] += 1
        if isinstance(uuid, str):
            self.uuids.add(uuid)
        if isinstance(rec.get("sessionId"), str) and self.session_id is None:
            self.session_id = rec["sessionId"]
        if isinstance(rec.get("version"), str):
            self.version = rec["version"]
        if isinstance(rec.get("cwd"), str) and self.cwd is None:
            self.cwd = rec["cwd"]

    def _blocks(self, rec: dict, w: str) -> tuple[dict, list[dict]]:
        """``message`` and its content as a list of blocks (a string is one text block)."""
        msg = req(rec, "message", dict, w, path=self.path, fmt=NAME)
        content = msg.get("content")
        if isinstance(content, str):
            return msg, [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise self.err(f"{w}.message.content", f"expected str or list, got {type(content).__name__}")
        for k, block in enumerate(content):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise self.err(f"{w}.message.content[{k}]", "expected a content block (an object with a type)")
        return msg, content

    def _assistant(self, rec: dict, w: str, ts: float | None) -> None:
        msg, blocks = self._blocks(rec, w)
        if msg.get("model") == "<synthetic>":
            self.skipped["synthetic"] += 1
            return
        calls = []  # checked before anything is added, so that a bad line leaves no trace
        for k, block in enumerate(blocks):
            if block["type"] == "tool_use":
                bw = f"{w}.message.content[{k}]"
                calls.append(ToolCall(req(block, "id", str, bw, path=self.path, fmt=NAME),
                                      req(block, "name", str, bw, path=self.path, fmt=NAME),
                                      dumps(block.get("input", {}))))
        mid = msg["id"] if isinstance(msg.get("id"), str) else str(rec.get("uuid") or w)
        reply = self.replies.get(mid)
        if reply is None:
            reply = self.replies[mid] = _Reply(self.b.add(Draft("assistant", timestamp=ts, where=w)))
        for block in blocks:
            if block["type"] == "text":
                reply.texts.append(block)
            elif block["type"] in _REASONING:
                reply.reasoning.append(block)
            elif block["type"] != "tool_use":
                self.ignored_blocks[block["type"]] += 1
        reply.draft.content = text(self.b, reply.texts, f"{w}.message.content")
        reply.draft.calls.extend(calls)
        self.call_names.update((c.id, c.name) for c in calls)
        if isinstance(msg.get("model"), str):
            reply.model = msg["model"]
        got = {key: dig(msg, "usage", name) for key, name in _USAGE}
        got["cache_write_1h"] = dig(msg, "usage", "cache_creation", "ephemeral_1h_input_tokens")
        for key, value in got.items():
            number = value if isinstance(value, int) and not isinstance(value, bool) else 0
            reply.usage[key] = max(reply.usage.get(key, 0), number)

    def _user(self, rec: dict, w: str, ts: float | None) -> None:
        msg, blocks = self._blocks(rec, w)
        if rec.get("isMeta") is True:
            self._meta(rec, blocks, w, ts)
            return
        if rec.get("isCompactSummary") is True:
            kept = [Message(role="user", content=text(self.b, blocks, f"{w}.message.content")).to_dict()]
            if self.compactions and not self.compactions[-1].kept:
                self.compactions[-1].kept = kept
            else:  # a summary without its boundary line
                self.compactions.append(_Compaction(None, None, ts, len(self.b.drafts), kept))
            return
        results, rest = [], []
        for k, block in enumerate(blocks):
            if block["type"] != "tool_result":
                rest.append(block)
                continue
            bw = f"{w}.message.content[{k}]"
            call_id = req(block, "tool_use_id", str, bw, path=self.path, fmt=NAME)
            body = block.get("content")
            results.append((Draft("tool", text(self.b, body, f"{bw}.content"), tool_call_id=call_id,
                                  name=self.call_names.get(call_id), timestamp=ts, where=bw), media_of(body)))
        body = text(self.b, rest, f"{w}.message.content")
        media = media_of(rest)
        if rest and not media and (not body.strip() or _WRAPPER.fullmatch(body)):
            if "<command-name>" in body and not results and isinstance(rec.get("uuid"), str):
                self.command = _Command(rec["uuid"], rest, ts, w)  # its body may follow
                return
            self.skipped["command" if body.strip() else "empty"] += 1
            rest = []
        elif not rest and not results:
            self.skipped["empty"] += 1
        if rest:
            results.append((Draft("user", body, timestamp=ts, where=w), media))
        for draft, media in results:
            self.b.add(draft)
            if media:
                self.media[id(draft)] = media

    def _meta(self, rec: dict, blocks: list[dict], w: str, ts: float | None) -> None:
        """An ``isMeta`` user line. Made only of tags (the local-command caveat): skipped as "meta".
        Otherwise it is the expanded body of a prompt command or of a skill, which the model
        received: a user message, joined after the command's tags when its parent is the command
        line held back (Claude Code sends the two lines as one user message)."""
        body = text(self.b, blocks, f"{w}.message.content")
        if not body.strip() or _WRAPPER.fullmatch(body):
            self.skipped["meta"] += 1
            return
        cmd, self.command = self.command, None  # line() dropped it unless this line is its body
        if cmd is not None:
            blocks, ts, w = cmd.blocks + blocks, cmd.timestamp, cmd.where
        draft = self.b.add(Draft("user", text(self.b, blocks, f"{w}.message.content"), timestamp=ts, where=w))
        media = media_of(blocks)
        if media:
            self.media[id(draft)] = media

    def _drop_command(self) -> None:
        """The command line held back had no body after it: a local command, skipped."""
        self.command = None
        self.skipped["command"] += 1

    # ------------------------------------------------------------------ the trace

    def trace(self) -> Trace:
        if self.command is not None:
            self._drop_command()
        drafts = list(self.b.drafts)  # finish() replaces none of them, but adds synthetic results
        messages, stats = self.b.finish()
        at, moved = _positions(drafts, messages)
        for d in drafts:
            if id(d) in self.media:
                i = at[id(d)]
                messages[i] = replace(messages[i], media=self.media[id(d)])
        usage: list[dict[str, Any]] = []
        reasoning: dict[str, list[dict]] = {}
        for reply in self.replies.values():
            i = at[id(reply.draft)]
            usage.append({"message": i, **{k: reply.usage.get(k, 0) for k, _ in _USAGE},
                          "cache_write_1h": reply.usage.get("cache_write_1h", 0), "model": reply.model,
                          "timestamp": reply.draft.timestamp})
            if reply.reasoning:
                reasoning[str(i)] = reply.reasoning
        compactions = []
        for c in self.compactions:
            after = [at[id(d)] for d in drafts[c.first_draft:] if id(d) not in moved]
            compactions.append({"at": min(after, default=len(messages)), "kept": c.kept, "trigger": c.trigger,
                                "pre_tokens": c.pre_tokens, "timestamp": c.timestamp})
        models = Counter(r.model for r in self.replies.values() if r.model)
        meta = {"session_id": self.session_id, "model": models.most_common(1)[0][0] if models else None,
                "agent_version": self.version, "cwd": self.cwd, "compactions": compactions, "usage": usage,
                "reasoning": reasoning, "skipped_lines": dict(self.skipped),
                "ignored_blocks": dict(self.ignored_blocks), **stats}
        trace_id = self.session_id or self.b.trace_id
        return Trace(source=NAME, trace_id=trace_id, path=str(self.path), messages=messages, meta=meta)


def _positions(drafts: list[Draft], messages: list[Message]) -> tuple[dict[int, int], set[int]]:
    """``id(draft) -> index in messages`` after :meth:`Builder.finish`, and the ids of the tool
    drafts it moved: user and assistant drafts keep their order; a tool draft that answered a call
    was moved after it (its ``tool_call_id`` is then the final, possibly renamed, id); one that
    answered none became a user message in place, prefixed :data:`ORPHAN_PREFIX`."""
    tool_at = {m.tool_call_id: i for i, m in enumerate(messages) if m.role == "tool"}
    others = iter(i for i, m in enumerate(messages) if m.role != "tool")
    out: dict[int, int] = {}
    claimed: set[int] = set()
    moved: set[int] = set()
    for d in drafts:
        if d.role == "tool":
            i = tool_at.get(d.tool_call_id)
            if i is not None and i not in claimed and messages[i].content == d.content:
                claimed.add(i)
                out[id(d)] = i
                moved.add(id(d))
                continue
            i = next(others)
            assert messages[i].content == ORPHAN_PREFIX + d.content, "pairing pass changed its order"
        else:
            i = next(others)
        out[id(d)] = i
    return out, moved
