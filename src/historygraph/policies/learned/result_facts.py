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
_ERROR = re.compile(r"<returncode>[1-9]|Traceback \(most recent call last\)|\b\w*Error\b|\bFAILED\b|\berror:")
_ERROR_PARTS = ((None, re.compile(r"<returncode>[1-9]")), ("Error", re.compile(r"Error\b")),
                ("FAILED", re.compile(r"\bFAILED\b")), ("error:", re.compile(r"\berror:")))


def has_error(text: str) -> bool:
    """``_ERROR.search(text)`` is not None, one alternative at a time, each searched only when its
    literal is in ``text`` (the alternation was tried at every position, ≈ 0.2 µs a character):
    ``\\b\\w*Error\\b`` matches where ``Error\\b`` does (the word characters before it reach back to
    their run's start, a boundary)."""
    if "Traceback (most recent call last)" in text:
        return True
    return any((lit is None or lit in text) and pat.search(text) is not None for lit, pat in _ERROR_PARTS)


def words(text: str) -> frozenset[str]:
    """Distinct lower-cased words of at least three characters (first :data:`TEXT_CHARS` characters)."""
    return frozenset(map(str.lower, set(_WORD.findall(text[:TEXT_CHARS]))))  # each distinct match lowered once


def _command(name: str, arguments: str) -> str:
    """The shell command of a bash-like call, else ``name`` and its arguments."""
    try:
        args = json.loads(arguments) if arguments else {}
    except ValueError:
        args = {}
    if isinstance(args, dict):
        for key in ("command", "cmd", "script"):
            if isinstance(args.get(key), str) and name.lower() in ("bash", "shell", "execute_bash", "run", "terminal",
                                                                   "run_command", "execute_command", "cmd"):
                return args[key]
        if isinstance(args.get("command"), str) and isinstance(args.get("path"), str):  # editor tools
            return f"{name} {args['command']} {args['path']}"
    return f"{name} {arguments}"


_EDIT = re.compile(r"\bsed\s+-i|cat\s*>|cat\s*<<|>\s*[\w/.-]+\.\w+\s*<<|\btee\b|\bpatch\b|\bapply_?patch\b|"
                   r"\bstr_replace\b(?!_editor\s+view)|\bcreate\b|\binsert\b|\bedit_file\b|\bwrite_file\b|"
                   r"open\([^)]*['\"]w")
_TEST = re.compile(r"\bpytest\b|\bunittest\b|\btox\b|\btest[\w./-]*\.py\b|\bruntests\b|\bmanage\.py\s+test\b|reproduce")
_VIEW = re.compile(r"^\s*(cat|head|tail|nl|less|more|sed\s+-n|awk)\b|\bview\b|\bread_file\b|\bopen_file\b|\bgoto\b|\bscroll")
_SEARCH = re.compile(r"^\s*(grep|rg|find|ls|tree|locate|git\s+grep|egrep|fgrep)\b|\bsearch|\bfind_file\b|\bgrep\b")
_RUN = re.compile(r"\bpython3?\b|\bnode\b|\bmake\b|\bbash\b|\./|\bpip\b")


def call_kind(name: str, arguments: str) -> str:
    """The kind of a tool call (one of :data:`KINDS`) from its name and arguments: a shell command
    is classified by its words (``sed -i`` edits, ``sed -n`` views, …), an editor tool by its
    sub-command. Order of tests: edit, test, view, search, run."""
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


def extract_facts(m: Message, call: ToolCall | None) -> tuple:
    """``(kind, command, call files, content files, identifiers, words, error)`` of the tool result
    ``m`` answering ``call`` (what a :data:`~historygraph.policies.learned.stored_kinds.RESULT_FACTS` row
    holds)."""
    name, args = (call.name, call.arguments) if call else ("", "")
    cmd = _command(name, args)
    return (call_kind(name, args), cmd.strip(), files_in(cmd), files_in(m.content[:TEXT_CHARS]),
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
