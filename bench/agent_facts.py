"""Agent-neutral facts of a tool result for the learned selector (issue 48; a variant measured by
``bench/fit_loao.py --variant neutral``, not the package's facts: docs/learned.md, "Across agent
families"). Replaces :func:`historygraph.policies.learned.result_facts.extract_facts` in this process
(:func:`use`): the call kind of Claude Code's and Codex CLI's file tools by their names
(:data:`TOOL_KINDS`), shell commands read without their ``cd DIR &&`` / ``export`` steps and from
``exec_command``'s ``cmd`` (:func:`call_kind`), a shell command of no known kind by its output's shape
(:func:`output_kind`), and exit codes and ``<tool_use_error>`` as errors (:func:`has_error`). The
feature columns are the package's (:data:`historygraph.policies.learned.features.FEATURES`).
"""

from __future__ import annotations

import json
import re

from historygraph.history.events import Message, ToolCall
from historygraph.policies.learned.result_facts import TEXT_CHARS, words
from historygraph.signals.steps.features import files_in, identifiers_in

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


def use() -> None:
    """Make this process's learned facts these (the per-graph state and the facts cache call
    ``extract_facts`` by their module's name)."""
    import historygraph.policies.learned.facts_cache as fc
    import historygraph.policies.learned.graph_state as gs

    fc.extract_facts = gs.extract_facts = extract_facts
