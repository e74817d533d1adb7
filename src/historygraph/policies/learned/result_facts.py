"""The facts of one tool result that regular expressions give, for the learned selector (ours,
beyond the papers): the kind of call that produced it (:func:`call_kind`), its command, the files
its call and its text name, its identifiers (ContextWeaver §3.1's code-like names), its words and
whether it reports an error (:func:`extract_facts`); and :class:`ResultFacts`, a result's facts
with its TFA values, as the per-graph state keeps them (:mod:`historygraph.policies.learned.graph_state`).

These are what a stored session keeps as :data:`~historygraph.policies.learned.stored_kinds.RESULT_FACTS`
rows, so that a reopened session does not run the expressions again.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from historygraph.history.events import Message, ToolCall
from historygraph.signals.steps.features import files_in, identifiers_in

KINDS = ("view", "search", "edit", "test", "run", "other")
TEXT_CHARS = 8000     # characters of a result read for words (as ContextRender A.3 clips results)

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_ERROR = re.compile(r"<returncode>[1-9]|Traceback \(most recent call last\)|\b\w*Error\b|\bFAILED\b|\berror:|"
                    r"[Ee]xit(?:ed with)? code:? [1-9]|<tool_use_error>")
_ERROR_PARTS = ((None, re.compile(r"<returncode>[1-9]")), ("Error", re.compile(r"Error\b")),
                ("FAILED", re.compile(r"\bFAILED\b")), ("error:", re.compile(r"\berror:")),
                ("xit", re.compile(r"[Ee]xit(?:ed with)? code:? [1-9]")), ("<tool_use_error>", None))


def has_error(text: str) -> bool:
    """``_ERROR.search(text)`` is not None, one alternative at a time, each searched only when its
    literal is in ``text`` (the alternation was tried at every position, ≈ 0.2 µs a character):
    ``\\b\\w*Error\\b`` matches where ``Error\\b`` does (the word characters before it reach back to
    their run's start, a boundary). The alternatives: mini-swe-agent's ``<returncode>``, a Python
    traceback, an ``…Error`` word, ``FAILED``, ``error:``, a non-zero exit code as Codex CLI
    (``Process exited with code 1``, ``Exit code: 1``) and OpenHands (``exit code 1``) report it,
    and Claude Code's ``<tool_use_error>``."""
    if "Traceback (most recent call last)" in text:
        return True
    return any((lit is None or lit in text) and (pat is None or pat.search(text) is not None)
               for lit, pat in _ERROR_PARTS)


def words(text: str) -> frozenset[str]:
    """Distinct lower-cased words of at least three characters (first :data:`TEXT_CHARS` characters)."""
    return frozenset(map(str.lower, set(_WORD.findall(text[:TEXT_CHARS]))))  # each distinct match lowered once


SHELLS = frozenset({"bash", "shell", "execute_bash", "run", "terminal", "run_command", "execute_command", "cmd",
                    "exec_command", "local_shell", "shell_command", "run_shell_command", "run_terminal_cmd"})
"""Tool names (lower-cased) whose ``command`` / ``cmd`` / ``script`` argument is a shell command:
mini-swe-agent's and SWE-agent's ``bash``, OpenHands' ``execute_bash``, Claude Code's ``Bash``, Codex
CLI's ``exec_command`` and ``shell``."""

TOOL_KINDS = {
    **dict.fromkeys(("read", "read_file", "view_file", "open_file", "notebookread", "webfetch"), "view"),
    **dict.fromkeys(("grep", "glob", "ls", "list_dir", "list_files", "find_file", "search", "file_search",
                     "codebase_search", "web_search", "websearch"), "search"),
    **dict.fromkeys(("edit", "multiedit", "write", "write_file", "create_file", "edit_file", "notebookedit",
                     "apply_patch"), "edit"),
}
"""The kind of a tool's result by the tool's name alone (lower-cased, an MCP server's prefix
``mcp__server__`` left out): the file tools of Claude Code (``Read``, ``Grep``, ``Glob``, ``Edit``,
``MultiEdit``, ``Write``), Codex CLI (``apply_patch``) and other agents' editors of the same names."""

_PREFIX = re.compile(r"\A\s*(?:(?:cd|export|source|\.)\s+[^;&|]+|\w+=\S*)\s*(?:&&|;)\s*")
_EDIT = re.compile(r"\bsed\s+-i|cat\s*>|cat\s*<<|>\s*[\w/.-]+\.\w+\s*<<|\btee\b|\bpatch\b|\bapply_?patch\b|"
                   r"\bstr_replace\b(?!_editor\s+view)|\bcreate\b|\binsert\b|\bedit_file\b|\bwrite_file\b|"
                   r"open\([^)]*['\"]w")
_TEST = re.compile(r"\bpytest\b|\bunittest\b|\btox\b|\btest[\w./-]*\.py\b|\bruntests\b|\bmanage\.py\s+test\b|reproduce|"
                   r"\b(?:go|cargo|npm|pnpm|yarn|bun|make|mvn|dotnet|swift)\s+(?:run\s+)?test\b|\bjest\b|\bvitest\b|"
                   r"\bmise\s+run\s+test")
_VIEW = re.compile(r"^\s*(cat|head|tail|nl|less|more|sed\s+-n|awk|git\s+(?:diff|show|log))\b|\bview\b|\bread_file\b|"
                   r"\bopen_file\b|\bgoto\b|\bscroll")
_SEARCH = re.compile(r"^\s*(grep|rg|find|ls|tree|locate|git\s+grep|egrep|fgrep|fd)\b|\bsearch|\bfind_file\b|\bgrep\b")
_RUN = re.compile(r"\bpython3?\b|\bnode\b|\bmake\b|\bbash\b|\./|\bpip\b")


def tool_name(name: str) -> str:
    """``name`` lower-cased, without an MCP server's ``mcp__server__`` prefix."""
    return name.lower().rsplit("__", 1)[-1]


def _shell(args: dict) -> str | None:
    """The shell command of a shell tool's arguments: ``command``, ``cmd`` or ``script``, a list of
    words joined (``["bash", "-lc", CMD]`` is ``CMD``), without leading ``cd DIR &&``, ``export``
    and ``VAR=value`` steps (so ``cd /testbed && sed -n …`` is a view)."""
    for key in ("command", "cmd", "script"):
        v = args.get(key)
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            v = v[2] if len(v) == 3 and v[1] in ("-c", "-lc") else " ".join(v)
        if isinstance(v, str):
            while (m := _PREFIX.match(v)) is not None:
                v = v[m.end():]
            return v
    return None


def _command(name: str, arguments: str) -> str:
    """The shell command of a shell tool's call (:data:`SHELLS`), else ``name`` and its arguments
    (an editor tool with a ``command`` and a ``path``: ``name command path``)."""
    try:
        args = json.loads(arguments) if arguments else {}
    except ValueError:
        args = {}
    if isinstance(args, dict):
        if tool_name(name) in SHELLS and (cmd := _shell(args)) is not None:
            return cmd
        if isinstance(args.get("command"), str) and isinstance(args.get("path"), str):  # editor tools
            return f"{name} {args['command']} {args['path']}"
    return f"{name} {arguments}"


def call_kind(name: str, arguments: str) -> str:
    """The kind of a tool call (one of :data:`KINDS`) from its name and arguments: a file tool by
    its name (:data:`TOOL_KINDS`), a shell command by its words (``sed -i`` edits, ``sed -n`` views,
    ``go test`` tests, …), an editor tool by its sub-command. Order of tests: edit, test, view,
    search, run."""
    kind = TOOL_KINDS.get(tool_name(name))
    if kind is not None:
        return kind
    cmd = _command(name, arguments)
    if _EDIT.search(cmd):
        return "edit"
    if _TEST.search(cmd):
        return "test"
    if _VIEW.search(cmd):
        return "view"
    if _SEARCH.search(cmd):
        return "search"
    if _RUN.search(cmd):
        return "run"
    return "other"


_HEADER = re.compile(r"\A(?:(?:Chunk ID|Wall time|Process exited with code|Exit code|Original token count|"
                     r"Process running with session ID)\b[^\n]*\n)*(?:Output:\n)?")
_NUMBERED = re.compile(r"^\s*\d+(?:[\t:|→]|\s{2,}|$)")
_HIT = re.compile(r"^(?:[\w./@+-]+:)?\d+[:-]")
_PATH = re.compile(r"^[\w./@+~-]+/?$|^[dl-][rwxsStT-]{9}[.@+]?\s")
_CODE = re.compile(r"^\s*(?:def |class |import |from \S+ import|#include|function |const |let |var |return\b|func |"
                   r"package |@\w)|[{};]\s*$")
_INDENTED = re.compile(r"^(?:\t| {2,})\S")
_TESTS = re.compile(r"\b\d+ (?:passed|failed)\b|\bRan \d+ tests?\b|test session starts|^(?:OK|FAILED)\b|\bPASSED\b|"
                    r"^(?:ok|FAIL)\s+\S+\s+(?:[\d.]+s|\(cached\))|^--- (?:FAIL|PASS):|^Tests:\s+\d+", re.M)
_DIFF = re.compile(r"^(?:@@ |\+\+\+ |--- )", re.M)
_WRAPPER = re.compile(r"\s*(?:<[^>]*>[^<]*(?:</[^>]*>)?|\(.*\)|\[.*\]|\S*[$#>])\s*")  # tags, notes, prompts


def output_kind(text: str) -> str:
    """The kind (one of :data:`KINDS`) of a shell command's output read from its shape, for a
    command whose words say nothing (``git status``, a project's own script): a test runner's
    summary (pytest, unittest, ``go test``, Jest) ``test``; a diff ``edit``; search hits
    (``path:line:``) or a listing (path-like lines, ``ls -l`` rows) ``search``; numbered, code-like
    or indented lines ``view``; other output of 2+ lines ``run``, shorter ``other``. A Codex CLI
    output header (``Chunk ID``, ``Wall time``, ``Output:``) and lines that are only a tag, a
    bracketed note or a prompt (``<returncode>0</returncode>``) are not counted; half of the
    non-empty lines decide a listing or hits, half a numbered listing, 15 % code-like lines, 40 %
    indented ones (the shares of the output-shape variant screened on leave-one-source-out in
    docs/learned.md)."""
    head = text[:TEXT_CHARS]
    head = head[_HEADER.match(head).end():]  # type: ignore[union-attr]  # (matches the empty string)
    lines = [ln for ln in head.splitlines() if ln.strip() and not _WRAPPER.fullmatch(ln)]
    n = len(lines)
    if _TESTS.search(head):
        return "test"
    if _DIFF.search(head):
        return "edit"
    if n >= 2:
        if sum(1 for ln in lines if _HIT.search(ln) or _PATH.search(ln)) * 2 >= n:
            return "search"
        if n >= 3 and (sum(1 for ln in lines if _NUMBERED.search(ln)) * 2 >= n
                       or sum(1 for ln in lines if _CODE.search(ln)) >= 0.15 * n
                       or sum(1 for ln in lines if _INDENTED.search(ln)) >= 0.4 * n):
            return "view"
        return "run"
    return "other"


def extract_facts(m: Message, call: ToolCall | None) -> tuple:
    """``(kind, command, call files, content files, identifiers, words, error)`` of the tool result
    ``m`` answering ``call`` (what a :data:`~historygraph.policies.learned.stored_kinds.RESULT_FACTS` row
    holds). The kind is :func:`call_kind`'s, or, for a shell command whose words say nothing,
    :func:`output_kind`'s (the output's shape)."""
    name, args = (call.name, call.arguments) if call else ("", "")
    cmd = _command(name, args)
    kind = call_kind(name, args)
    if kind == "other" and tool_name(name) in SHELLS:
        kind = output_kind(m.content)
    return (kind, cmd.strip(), files_in(cmd), files_in(m.content[:TEXT_CHARS]),
            identifiers_in(m.content[:TEXT_CHARS]), words(m.content), has_error(m.content[:TEXT_CHARS]))


def command_key(command: str) -> str:
    """A command's key among the commands run (``superseded``): its BLAKE2b digest, 16 bytes in hex,
    so that the per-graph state and its snapshot do not hold each command's text (a heredoc that
    writes a whole file is one; the commands were a quarter of a 1,000-result snapshot's bytes)."""
    return hashlib.blake2b(command.encode(), digest_size=16).hexdigest()


@dataclass
class ResultFacts:
    """A stored tool result's facts, its TFA values and what of them it was the first to hold."""

    position: int
    owner: int                 # position of the assistant message that called it
    values: frozenset[str]
    own_values: frozenset[str]  # values no earlier result holds (TFA attributes their reuse here)
    idents: frozenset[str]
    own_idents: frozenset[str]  # identifiers no earlier result holds
    words: frozenset[str]
    kind: str
    command: str
    files: frozenset[str]      # files named by the call
    shown_files: frozenset[str]  # files named by the call or the result
    content_files: frozenset[str]  # files named by the result (a search's hits included)
    tokens: int
    error: bool
