"""Render-time features of a tool result for the learned selector (ours, beyond the papers).

Every feature is computed from what a production system has when it renders the history for
invocation ``t`` (``t = graph.turns``): the stored messages, their tool calls, and the observed
reuse of Tool-Flow Analysis (TFA, "ContextRender: From Execution Dependencies to Agent Context", arXiv:2609.37743,
§3.2 and A.2; here
:mod:`historygraph.signals.reuse`). Nothing reads the future and nothing uses the evaluator's
B.4 labelling rule (:mod:`historygraph.eval.recall`): identifiers are TFA values, words are plain
lower-cased words.

Features of result ``r`` (a row of :func:`feature_matrix`; names in :data:`FEATURES`):

* ``age``, ``log_age``, ``recency``: turns since ``r`` (ContextRender §3.3 age), ``ln(1+age)`` and
  ContextRender's recency term ``e^{−0.3·age}`` (A.3). Agents mostly reuse what they just saw.
* ``reuse_score``: TFA's ``ln(1 + c_t(r))`` (eq. 1). ``reuse_turns``: ``ln(1 + number of earlier
  invocations that reused a value first seen in r)``. ``reused_last``: 1 when the latest assistant
  message reused it; ``reused_recent``: reusing invocations among the last 3. ``since_reuse``:
  ``ln(1 + turns since the last reuse)``, ``ln(2 + age)`` when never reused; ``never_reused``.
  A result the agent keeps coming back to (the file it is editing) is reused again.
* ``latest_values``, ``task_values``: ``ln(1 + |V(r) ∩ V(m)|)`` for the TFA values ``V`` of the
  latest assistant message (text and tool calls) and of the first user message (the task), whether
  or not TFA attributes them to ``r``.
* ``latest_cover``, ``task_cover``: the share of the message's distinct words (IDF-weighted over the
  session's tool results so far) that ``r`` contains: lexical relevance, no model needed.
* ``log_tokens``: ``ln(1 + tokens of r)``; the selector divides by size separately, this lets the
  model learn that huge outputs (full file dumps, logs) are rarely what is reused.
* ``kind_*``: the kind of tool call that produced ``r`` (:func:`call_kind`): ``view`` (cat, sed -n,
  head, an editor's view), ``search`` (grep, find, ls), ``edit`` (sed -i, heredoc writes, editor
  str_replace/create), ``test`` (pytest, test scripts), ``run`` (other python/scripts), ``other``.
* ``ancestor``: 1 when ``r`` belongs to an ancestor of the current step in ContextWeaver's step
  graph (low-cost parents, breadth-first up to 10 steps; ContextWeaver §3.1, §3.3).
* ``superseded``: 1 when a later call viewed the same file again or re-ran the same command (its
  output is likely stale). ``edited_later``: 1 when a later call edited a file that ``r`` shows.
* ``path_in_latest``: 1 when a file ``r`` shows or touched is named in the latest assistant message.
* ``unique_values``: ``ln(1 + number of TFA values of r that no other result holds)``;
  ``log_values``: ``ln(1 + |V(r)|)``. Values found only here can only be reused from here.
* ``error``: 1 when ``r`` reports a non-zero return code, a traceback or an error.
* ``latest_result``: 1 for a result of the latest assistant message.
* Identifiers (ContextWeaver §3.1's code-like names, :func:`historygraph.signals.steps.identifiers_in`),
  attributed as TFA attributes values, to the first tool result holding them: ``own_values`` and
  ``own_idents``, ``ln(1 + number of values / identifiers no earlier result holds)``; ``ident_turns``,
  ``ln(1 + earlier assistant messages naming one of r's own identifiers)``; ``latest_idents`` and
  ``latest_own_idents``, identifiers (own ones) of r named by the latest assistant message;
  ``recent_own_idents``, own identifiers named by the last 3 assistant messages (summed);
  ``task_idents``, identifiers of r named in the task. Identifier reuse catches dotted and
  partial names (``DATE_RE`` in ``DATE_RE.match``) that TFA's whole-value matching misses.
* Echoes in the newest results (the results of the latest assistant message, which the next
  invocation answers): ``echo_values``, ``ln(1 + |V(r) ∩ V(newest)|)``; ``echo_own_values`` and
  ``echo_own_idents``, the same for the values / identifiers first held by ``r`` (a value the
  agent just saw again, which TFA attributes to ``r`` when the agent uses it); ``echo_files``, 1
  when a file ``r`` shows or touched is named in the newest results (a traceback pointing into a
  file viewed earlier). 0 for the newest results themselves.

Per-result facts that do not change (values, words, kind, files, tokens) are computed once per
graph and extended incrementally (the graph is append-only), so a render costs ``O(n)`` small
set operations for ``n`` stored results.
"""

from __future__ import annotations

import json
import math
import re
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..graph import ContextGraph, operations
from ..signals.reuse import extract_values
from ..signals.steps import ancestry, files_in, identifiers_in, lowcost_steps
from ..signals.tokens import TokenCounter

FEATURES: tuple[str, ...] = (
    "age", "log_age", "recency",
    "reuse_score", "reuse_turns", "reused_last", "reused_recent", "since_reuse", "never_reused",
    "latest_values", "task_values", "latest_cover", "task_cover",
    "log_tokens",
    "kind_view", "kind_search", "kind_edit", "kind_test", "kind_run", "kind_other",
    "ancestor", "superseded", "edited_later", "path_in_latest",
    "unique_values", "log_values", "error", "latest_result",
    "own_values", "own_idents", "ident_turns", "latest_idents", "latest_own_idents", "recent_own_idents", "task_idents",
    "echo_values", "echo_own_values", "echo_own_idents", "echo_files",
)
KINDS = ("view", "search", "edit", "test", "run", "other")
ANCESTRY_STEPS = 10   # W of the ancestry feature (ContextWeaver §3.1; the value contextrender-dep uses)
RECENT_TURNS = 3
TEXT_CHARS = 8000     # characters of a result read for words (as ContextRender A.3 clips results)

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_ERROR = re.compile(r"<returncode>[1-9]|Traceback \(most recent call last\)|\b\w*Error\b|\bFAILED\b|\berror:")


def words(text: str) -> frozenset[str]:
    """Distinct lower-cased words of at least three characters (first :data:`TEXT_CHARS` characters)."""
    return frozenset(w.lower() for w in _WORD.findall(text[:TEXT_CHARS]))


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


@dataclass
class _ResultFacts:
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


@dataclass
class _GraphFacts:
    """Per-graph incremental state: facts of each result, word document frequencies, and the
    latest positions at which each file was viewed or edited and each command was run."""

    upto: int = 0
    facts: dict[int, _ResultFacts] = field(default_factory=dict)
    df: dict[str, int] = field(default_factory=dict)
    value_df: dict[str, int] = field(default_factory=dict)
    last_view: dict[str, int] = field(default_factory=dict)     # file -> latest result position viewing it
    last_edit: dict[str, int] = field(default_factory=dict)     # file -> latest result position editing it
    last_command: dict[str, int] = field(default_factory=dict)  # command -> latest result position
    ident_first: dict[str, int] = field(default_factory=dict)   # identifier -> first result position holding it
    ident_turns: dict[int, list[int]] = field(default_factory=dict)  # result -> turns whose message names an own identifier
    assistant_idents: list[tuple[int, frozenset[str]]] = field(default_factory=list)  # (turn, identifiers) per message
    value_first: dict[str, int] = field(default_factory=dict)   # TFA value -> first result position holding it
    unique: dict[int, int] = field(default_factory=dict)        # result -> its values no other result holds
    task: tuple[str, frozenset[str], frozenset[str], frozenset[str]] | None = None  # text, values, words, identifiers
    encoding: str = ""


_CACHE: "weakref.WeakKeyDictionary[ContextGraph, _GraphFacts]" = weakref.WeakKeyDictionary()


def graph_facts(graph: ContextGraph, counter: TokenCounter) -> _GraphFacts:
    gf = _CACHE.get(graph)
    if gf is None or gf.encoding != counter.encoding_name or gf.upto > len(graph):
        gf = _CACHE[graph] = _GraphFacts(encoding=counter.encoding_name)
    msgs = graph.messages
    for p in range(gf.upto, len(msgs)):
        m = msgs[p]
        if m.role == "assistant":
            ids = identifiers_in("\n".join(operations(m)))
            turn = graph.turn_of[p]
            gf.assistant_idents.append((turn, ids))
            for r in {gf.ident_first[i] for i in ids if i in gf.ident_first}:
                gf.ident_turns.setdefault(r, []).append(turn)
            continue
        if m.role != "tool":
            continue
        owner = graph.call_owner.get(m.tool_call_id or "", p)
        call = next((c for c in msgs[owner].tool_calls if c.id == m.tool_call_id), None) if owner != p else None
        name, args = (call.name, call.arguments) if call else ("", "")
        cmd = _command(name, args)
        kind = call_kind(name, args)
        cfiles = files_in(cmd)
        content_files = files_in(m.content[:TEXT_CHARS])
        values = frozenset(extract_values(m.content))
        idents = identifiers_in(m.content[:TEXT_CHARS])
        own_idents = frozenset(i for i in idents if i not in gf.ident_first)
        f = _ResultFacts(position=p, owner=owner, values=values, own_values=frozenset(v for v in values if v not in gf.value_df),
                         idents=idents, own_idents=own_idents, words=words(m.content),
                         kind=kind, command=cmd.strip(), files=cfiles,
                         shown_files=cfiles | (content_files if kind != "search" else frozenset()), content_files=content_files,
                         tokens=counter.count(m.content), error=bool(_ERROR.search(m.content[:TEXT_CHARS])))
        gf.facts[p] = f
        for w in f.words:
            gf.df[w] = gf.df.get(w, 0) + 1
        gf.unique[p] = 0
        for v in f.values:
            df = gf.value_df.get(v, 0)
            if df == 0:
                gf.value_first[v] = p
                gf.unique[p] += 1
            elif df == 1:
                gf.unique[gf.value_first[v]] -= 1
            gf.value_df[v] = df + 1
        for i in own_idents:
            gf.ident_first[i] = p
        for name_ in cfiles:
            if kind == "view":
                gf.last_view[name_] = p
            elif kind == "edit":
                gf.last_edit[name_] = p
        if f.command:
            gf.last_command[f.command] = p
    gf.upto = len(msgs)
    return gf


def _cover(result_words: frozenset[str], query: frozenset[str], idf: dict[str, float], total: float) -> float:
    if total <= 0:
        return 0.0
    return sum(idf[w] for w in result_words & query) / total


def _task(gf: _GraphFacts, text: str) -> tuple[str, frozenset[str], frozenset[str], frozenset[str]]:
    if gf.task is None or gf.task[0] is not text:
        gf.task = (text, frozenset(extract_values(text)), words(text), identifiers_in(text))
    return gf.task


def feature_matrix(graph: ContextGraph, positions: list[int], counter: TokenCounter) -> np.ndarray:
    """Features (:data:`FEATURES`, in that order) of the tool results at ``positions`` for the next
    invocation of ``graph``; shape ``(len(positions), len(FEATURES))``, float64.

    Raises:
        KeyError: a position that is not a stored tool result.
    """
    gf = graph_facts(graph, counter)
    msgs = graph.messages
    t = graph.turns
    task_text = next((m.content for m in msgs if m.role == "user"), "")
    latest = next((p for p in range(len(msgs) - 1, -1, -1) if msgs[p].role == "assistant"), None)
    latest_text = "\n".join(operations(msgs[latest])) if latest is not None else ""
    _, task_values, task_words, task_idents = _task(gf, task_text)
    latest_values, latest_words = extract_values(latest_text), words(latest_text)
    latest_files = files_in(latest_text)
    latest_idents = identifiers_in(latest_text)
    recent_idents = [ids for turn, ids in gf.assistant_idents if turn > t - RECENT_TURNS]
    n_docs = max(1, len(gf.facts))
    idf = {w: math.log(1.0 + n_docs / (1.0 + gf.df.get(w, 0))) for w in latest_words | task_words}
    latest_total = sum(idf[w] for w in latest_words)
    task_total = sum(idf[w] for w in task_words)
    fresh = [q for q in range(latest + 1, len(msgs)) if q in gf.facts] if latest is not None else []
    fresh_values = frozenset().union(*(gf.facts[q].values for q in fresh))
    fresh_idents = frozenset().union(*(gf.facts[q].idents for q in fresh))
    fresh_files = frozenset().union(*(gf.facts[q].content_files for q in fresh))
    deps: set[int] = set()
    steps = lowcost_steps(graph)
    if steps:
        deps = {p for i in ancestry(steps, len(steps) - 1, ANCESTRY_STEPS) for p in steps[i].results}
    turn_of = graph.turn_of
    out = np.zeros((len(positions), len(FEATURES)))
    for row, p in enumerate(positions):
        f = gf.facts[p]
        age = t - turn_of[p]
        matches = graph.reuse.matches.get(p, ())
        reuse_turns = {turn_of[m.user] for m in matches}
        last = max(reuse_turns) if reuse_turns else None
        later_view = any(gf.last_view.get(x, -1) > p for x in f.files) if f.kind == "view" else False
        superseded = later_view or gf.last_command.get(f.command, -1) > p
        edited_later = any(gf.last_edit.get(x, -1) > p for x in f.shown_files)
        unique = gf.unique[p]
        out[row] = (
            age, math.log1p(age), math.exp(-0.3 * age),
            math.log1p(graph.reuse.score(p)), math.log1p(len(reuse_turns)),
            float(last is not None and last == t), float(sum(1 for x in reuse_turns if x > t - RECENT_TURNS)),
            math.log1p(t - last) if last is not None else math.log(2 + age), float(last is None),
            math.log1p(len(f.values & latest_values)), math.log1p(len(f.values & task_values)),
            _cover(f.words, latest_words, idf, latest_total), _cover(f.words, task_words, idf, task_total),
            math.log1p(f.tokens),
            *(float(f.kind == k) for k in KINDS),
            float(p in deps), float(superseded), float(edited_later),
            float(bool(f.shown_files & latest_files)),
            math.log1p(unique), math.log1p(len(f.values)), float(f.error), float(f.owner == latest),
            math.log1p(len(f.own_values)), math.log1p(len(f.own_idents)), math.log1p(len(set(gf.ident_turns.get(p, ())))),
            math.log1p(len(f.idents & latest_idents)), math.log1p(len(f.own_idents & latest_idents)),
            math.log1p(sum(len(f.own_idents & ids) for ids in recent_idents)), math.log1p(len(f.idents & task_idents)),
            *((0.0, 0.0, 0.0, 0.0) if f.owner == latest else
              (math.log1p(len(f.values & fresh_values)), math.log1p(len(f.own_values & fresh_values)),
               math.log1p(len(f.own_idents & fresh_idents)), float(bool(f.shown_files & fresh_files)))),
        )
    return out
