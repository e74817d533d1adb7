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
* Identifiers (ContextWeaver §3.1's code-like names, :func:`historygraph.signals.steps.features.identifiers_in`),
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
set operations for ``n`` stored results. The regular-expression part of them (kind, command, files,
identifiers, words, error; the values are the graph's TFA values) is kept with a stored session
as :data:`RESULT_FACTS` rows (:mod:`historygraph.history.derived`), so a reopened session reads it; the
per-graph state itself is kept as one :data:`FACTS_SNAPSHOT` row, rewritten when the session has
grown by a quarter, so a reopened session's first render starts from it and extends it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import weakref
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from historygraph.history.derived import DerivedKind, pack_array, snapshot_due
from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph, operations
from historygraph.signals.int_table import LOG1P, IntTable
from historygraph.signals.reuse import extract_values
from historygraph.signals.steps.features import STEP_MODULES, files_in, identifiers_in
from historygraph.signals.steps.view import latest_ancestry_results
from historygraph.signals.tokens import TokenCounter

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

RESULT_FACTS = DerivedKind("learned.facts", ("historygraph.policies.learned.features", *STEP_MODULES))
"""Derived rows per message: a tool result's ``[kind, command, call files, content files,
identifiers, words, error]`` (sorted lists), an assistant message's ``[identifiers]``."""

TASK_FACTS = DerivedKind("learned.task", ("historygraph.policies.learned.features", *STEP_MODULES,
                                           "historygraph.signals.reuse"))
"""A derived row at the position of the task (the first user message): ``[values, words,
identifiers]`` of its text (sorted lists), so that a reopened session's first render does not run
the extractors over the task again (a long prompt)."""

FACTS_SNAPSHOT = DerivedKind("learned.graph", ("historygraph.policies.learned.features", *STEP_MODULES,
                                                "historygraph.signals.reuse", "historygraph.history.graph", "historygraph.history.derived"))
"""A derived row (position 0) holding the per-graph state of :func:`graph_facts` at a known number
of messages (:func:`_pack_facts`), rewritten when the session has grown by a quarter (as the step
view's snapshot, :data:`historygraph.history.derived.SNAPSHOT_GROWTH`), so that a reopened
session's first render starts from it instead of rebuilding every result's facts."""

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


def _extract_facts(m: Message, call: ToolCall | None) -> tuple:
    """``(kind, command, call files, content files, identifiers, words, error)`` of the tool result
    ``m`` answering ``call`` (what a :data:`RESULT_FACTS` row holds)."""
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


class _Grow:
    """A numpy array that grows at its end (capacity doubling); ``view()`` is its filled part."""

    __slots__ = ("a", "n")

    def __init__(self, dtype: type, width: int = 0) -> None:
        self.a: np.ndarray = np.zeros((64, width) if width else 64, dtype)
        self.n = 0

    def extend(self, rows: list) -> None:
        k = len(rows)
        self.reserve(k)
        if k:
            self.a[self.n - k:self.n] = rows

    def reserve(self, k: int) -> None:
        """Add ``k`` rows of zeros at the end (filled in place by the caller)."""
        if self.n + k > len(self.a):
            new = np.zeros((max(2 * len(self.a), self.n + k),) + self.a.shape[1:], self.a.dtype)
            new[:self.n] = self.a[:self.n]
            self.a = new
        self.a[self.n:self.n + k] = 0
        self.n += k

    def view(self) -> np.ndarray:
        return self.a[:self.n]


_INDEX_MIN = 512  # entries added since the postings were last extended before they are merged in (and 1/32 of all)


class _Flat:
    """The members of one set-valued fact of every result (its values, words, …) as flat
    ``(row, id, own)`` arrays over a per-graph vocabulary, so that ``Σ_{m ∈ S(r) ∩ Q} w(m)`` for
    every ``r`` is one ``np.bincount``. ``own``: the member was first held by that row (TFA
    attribution). Rows added are collected in lists and moved into the arrays when next read.

    The entries are also kept as postings (the rows holding each member, grouped by member), into
    which the entries added since are merged once there are enough of them (a copy, no sort of
    the postings); a query reads the postings of its members and the entries added since, so a
    render reads ``O(matches)``, not every entry."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self._queries: dict[int, tuple[frozenset[str], dict[str, int], int, list[str], np.ndarray]] = {}  # _query_ids
        self.rows, self.ids, self.own = _Grow(np.int32), _Grow(np.int32), _Grow(np.float64)
        self.df = _Grow(np.int64)  # rows holding each vocabulary entry (a row's members are distinct)
        self._added: tuple[list[int], list[int], list[float]] = ([], [], [])
        self._indexed = 0  # entries in the postings
        self._post_rows, self._post_own = np.zeros(0, np.intp), np.zeros(0)
        self._indptr = np.zeros(1, np.intp)  # member i's postings: _post_rows[_indptr[i]:_indptr[i + 1]]

    def add(self, row: int, members: "list[str] | frozenset[str]", own: frozenset[str] = frozenset()) -> None:
        vocab = self.vocab
        rows, ids, owns = self._added
        k = len(ids)
        ids.extend([vocab.setdefault(m, len(vocab)) for m in members])
        rows.extend([row] * (len(ids) - k))
        owns.extend([float(m in own) for m in members] if own else [0.0] * (len(ids) - k))

    def lookup(self, members: "list[str] | set[str] | frozenset[str]") -> np.ndarray:
        """Vocabulary ids of the known ``members``, in their order (intp)."""
        get = self.vocab.get
        return np.array([i for m in members if (i := get(m)) is not None], dtype=np.intp)

    def _flush(self) -> None:
        if self._added[0]:
            new = np.asarray(self._added[1], dtype=np.int64)
            for grow, added in zip((self.rows, self.ids, self.own), self._added):
                grow.extend(added)
                added.clear()
            self.df.reserve(len(self.vocab) - self.df.n)
            self.df.view()[:] += np.bincount(new, minlength=len(self.vocab))

    def counts(self) -> np.ndarray:
        """Rows holding each vocabulary entry (its document frequency)."""
        self._flush()
        return self.df.view()

    def sums(self, ids: np.ndarray, n: int, weights: "np.ndarray | None" = None, own: bool = False) -> np.ndarray:
        """``Σ weights[k]`` over the members ``ids[k]`` of each row's set, per row (``n`` rows; weights
        1 by default; only members first held by the row when ``own``). Each row's terms are added
        left to right from 0.0 in the order of ``ids`` (``np.bincount`` adds sequentially), which is
        the row's own order of its members when ``ids`` is in that order."""
        return self.sums_many([(ids, weights, own)], n)[0]

    def sums_many(self, queries: "list[tuple[np.ndarray, np.ndarray | None, bool]]", n: int) -> np.ndarray:
        """:meth:`sums` of each ``(ids, weights, own)`` of ``queries``, as the rows of one
        ``(len(queries), n)`` array, in the same numpy passes for all (a render asks for up to five
        per table, each a few members: the passes' fixed cost was most of it). The same bits as one
        :meth:`sums` per query: ``np.bincount`` over ``query · n + row`` adds each bin's terms in
        the order they come, which is each query's own order."""
        self._flush()
        total = self.ids.n
        if total - self._indexed > max(_INDEX_MIN, total // 32):
            self._index()
        nq = len(queries)
        ids = np.concatenate([q[0] for q in queries]) if nq > 1 else np.asarray(queries[0][0])
        ids = ids.astype(np.intp, copy=False)
        sizes = [len(q[0]) for q in queries]
        w = np.concatenate([np.ones(k) if q[1] is None else np.asarray(q[1], dtype=np.float64)
                            for q, k in zip(queries, sizes)]) if nq else np.zeros(0)
        which = np.repeat(np.arange(nq), sizes)  # the query of each of ids
        owns = np.array([bool(q[2]) for q in queries])
        out = np.zeros((nq, n))
        if self._indexed:  # the postings of the members, concatenated in the order of ids
            known = ids < len(self._indptr) - 1
            q, wq, qk = ids[known], w[known], which[known]
            starts, lens = self._indptr[q], self._indptr[q + 1] - self._indptr[q]
            at = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
            x = np.repeat(wq, lens)
            per = np.repeat(qk, lens)
            if owns.any():
                x = np.where(owns[per], x * self._post_own[at], x)
            out = np.bincount(per * n + self._post_rows[at], weights=x, minlength=nq * n).reshape(nq, n)
        if total > self._indexed:  # the entries added since, in their order
            full = np.zeros((nq, len(self.vocab)))
            full[which, ids] = w
            x = full[:, self.ids.a[self._indexed:total]]
            if owns.any():
                x[owns] = x[owns] * self.own.a[self._indexed:total]
            key = (np.arange(nq)[:, None] * n + self.rows.a[self._indexed:total]).ravel()
            out = out + np.bincount(key, weights=x.ravel(), minlength=nq * n).reshape(nq, n)
        return out

    def _index(self) -> None:
        """Merge the entries added since into the postings: each at the end of its member's rows
        (its row comes after them), in the order added."""
        a, total, size = self._indexed, self.ids.n, len(self.vocab)
        new = self.ids.a[a:total]
        order = np.argsort(new, kind="stable")
        indptr = self._indptr
        if len(indptr) < size + 1:  # members first seen since
            indptr = np.concatenate([indptr, np.full(size + 1 - len(indptr), indptr[-1])])
        at = indptr[new[order] + 1]
        self._post_rows = np.insert(self._post_rows, at, self.rows.a[a:total][order])
        self._post_own = np.insert(self._post_own, at, self.own.a[a:total][order])
        self._indptr = indptr + np.concatenate([[0], np.cumsum(np.bincount(new, minlength=size))])
        self._indexed = total


class _Facts(MutableMapping[int, _ResultFacts]):
    """:attr:`_GraphFacts.facts`: the results' :class:`_ResultFacts` by position. Those of a state
    read from a stored snapshot (:func:`_unpack_facts`) are built when first asked for, from the
    message (the same pure functions as a :data:`RESULT_FACTS` row), its graph's TFA values and the
    first holders of each value and identifier (what was a result's own when it was added); a
    render asks for the newest few. Holds the graph's message list, call owners and reuse index,
    not the graph (the per-graph cache is keyed weakly by the graph)."""

    def __init__(self) -> None:
        self.built: dict[int, _ResultFacts] = {}
        self.cache: dict[int, _ResultFacts] = {}  # the lazy ones built so far
        self.lazy: list[int] = []       # positions read from a snapshot, ascending (all before the built ones)
        self.lazy_set: set[int] = set()
        self.source: tuple | None = None  # (messages, call owners, reuse index, counter, value_first, ident_first)

    def __len__(self) -> int:
        return len(self.lazy) + len(self.built)

    def __contains__(self, p: object) -> bool:
        return p in self.built or p in self.lazy_set

    def __iter__(self) -> Iterator[int]:
        yield from self.lazy
        yield from self.built

    def __getitem__(self, p: int) -> _ResultFacts:
        f = self.built.get(p)
        if f is None:
            f = self.cache.get(p)
        if f is not None:
            return f
        if p not in self.lazy_set or self.source is None:
            raise KeyError(p)
        f = self.cache[p] = self._build(p)
        return f

    def _build(self, p: int) -> _ResultFacts:
        msgs, call_owner, reuse, counter, value_first, ident_first = self.source  # type: ignore[misc]
        m = msgs[p]
        owner = call_owner.get(m.tool_call_id or "", p)
        call = next((c for c in msgs[owner].tool_calls if c.id == m.tool_call_id), None) if owner != p else None
        kind, command, cfiles, content_files, idents, words_, error = _extract_facts(m, call)
        values = reuse.values[p]
        return _ResultFacts(position=p, owner=owner, values=values,
                            own_values=frozenset(v for v in values if value_first.get(v) == p),
                            idents=idents, own_idents=frozenset(i for i in idents if ident_first.get(i) == p),
                            words=words_, kind=kind, command=command, files=cfiles,
                            shown_files=cfiles | (content_files if kind != "search" else frozenset()),
                            content_files=content_files, tokens=counter.count(m.content), error=error)

    def __setitem__(self, p: int, f: _ResultFacts) -> None:
        self.built[p] = f

    def __delitem__(self, p: int) -> None:
        raise TypeError("facts are only ever added")


_STATIC = ("log_tokens", *(f"kind_{k}" for k in KINDS), "log_values", "error", "own_values", "own_idents")


def _blocks(names: tuple[str, ...]) -> list[tuple[slice, slice]]:
    """``(columns of FEATURES, columns of names)`` for each run of ``names`` that is a run of
    adjacent features (one copy per run instead of one per column)."""
    at = [FEATURES.index(x) for x in names]
    out: list[tuple[slice, slice]] = []
    start = 0
    for k in range(1, len(at) + 1):
        if k == len(at) or at[k] != at[k - 1] + 1:
            out.append((slice(at[start], at[k - 1] + 1), slice(start, k)))
            start = k
    return out


_STATIC_BLOCKS = _blocks(_STATIC)


@dataclass
class _GraphFacts:
    """Per-graph incremental state: facts of each result, word document frequencies, and the
    latest positions at which each file was viewed or edited and each command was run. The same
    facts are also kept as arrays over results in transcript order (row ``i`` is the ``i``-th
    stored result): the features that do not change between renders, the flags that only ever turn
    on (superseded, edited later), and flat tables of each result's values, identifiers, words and
    files (:class:`_Flat`), so that a render is a few numpy passes."""

    upto: int = 0
    facts: _Facts = field(default_factory=_Facts)
    value_df: dict[str, int] = field(default_factory=dict)
    last_view: dict[str, int] = field(default_factory=dict)     # file -> latest result position viewing it
    last_edit: dict[str, int] = field(default_factory=dict)     # file -> latest result position editing it
    last_command: dict[str, int] = field(default_factory=dict)  # command_key(command) -> latest result position
    ident_first: dict[str, int] = field(default_factory=dict)   # identifier -> first result position holding it
    ident_turns: dict[int, list[int]] = field(default_factory=dict)  # result -> turns whose message names an own identifier
    assistant_idents: list[tuple[int, frozenset[str]]] = field(default_factory=list)  # (turn, identifiers) per message
    value_first: dict[str, int] = field(default_factory=dict)   # TFA value -> first result position holding it
    unique: dict[int, int] = field(default_factory=dict)        # result -> its values no other result holds
    task: tuple[str, frozenset[str], frozenset[str], frozenset[str]] | None = None  # text, values, words, identifiers
    encoding: str = ""
    kept: int = 0  # messages of the last snapshot read or put (FACTS_SNAPSHOT)
    # arrays over results (row i = i-th result)
    row_of: dict[int, int] = field(default_factory=dict)        # result position -> row
    positions: list[int] = field(default_factory=list)          # row -> result position (row_of's keys in order)
    turn: _Grow = field(default_factory=lambda: _Grow(np.intp))
    owner: _Grow = field(default_factory=lambda: _Grow(np.intp))
    static: _Grow = field(default_factory=lambda: _Grow(np.float64, len(_STATIC)))
    unique_n: _Grow = field(default_factory=lambda: _Grow(np.intp))
    superseded: _Grow = field(default_factory=lambda: _Grow(np.float64))
    edited_later: _Grow = field(default_factory=lambda: _Grow(np.float64))
    ident_turns_n: _Grow = field(default_factory=lambda: _Grow(np.intp))  # distinct turns in ident_turns
    unedited: dict[str, list[int]] = field(default_factory=dict)  # file -> rows showing it not yet edited later
    values_t: _Flat = field(default_factory=_Flat)
    idents_t: _Flat = field(default_factory=_Flat)
    words_t: _Flat = field(default_factory=_Flat)   # each row's words in sorted order
    files_t: _Flat = field(default_factory=_Flat)   # shown files
    reuse_seen: dict[int, tuple[int, list[int]]] = field(default_factory=dict)  # result -> (matches read, distinct reuse turns)
    # observed reuse per row, updated for the results the graph's TFA index lists as changed
    reuse_read: int = 0  # entries of graph.reuse.touched read
    reuse_score: _Grow = field(default_factory=lambda: _Grow(np.float64))  # ln(1 + c_t(r))
    reuse_turns: _Grow = field(default_factory=lambda: _Grow(np.intp))     # distinct reusing turns
    reuse_last: _Grow = field(default_factory=lambda: _Grow(np.intp))      # the latest of them
    reuse_recent: _Grow = field(default_factory=lambda: _Grow(np.intp, RECENT_TURNS))  # the latest RECENT_TURNS, newest first


_CACHE: "weakref.WeakKeyDictionary[ContextGraph, _GraphFacts]" = weakref.WeakKeyDictionary()


def _grow_of(a: np.ndarray) -> _Grow:
    """A :class:`_Grow` holding ``a`` (an array of its own, e.g. :func:`_unpacked`'s: used as
    the buffer, full; the next ``reserve`` doubles it)."""
    g = _Grow.__new__(_Grow)
    g.a = a if a.flags.writeable else a.copy()
    g.n = len(a)
    return g


class _Idents(list):
    """``assistant_idents`` read from a snapshot: ``(turn, frozenset of identifiers)`` per assistant
    message, each entry made from its stored ``[turn, identifiers]`` when first read (a render
    reads the last few, newest first). Appended to as a list; reading entries in any other way
    makes every entry first."""

    def __init__(self, rows: list) -> None:
        super().__init__(rows)
        self.raw = len(rows)  # entries still stored rows, all before the first made one counted from the end

    def _make(self, i: int) -> tuple[int, frozenset[str]]:
        v = list.__getitem__(self, i)
        if type(v) is list:
            v = (v[0], frozenset(v[1]))
            list.__setitem__(self, i, v)
        return v

    def __reversed__(self):  # type: ignore[no-untyped-def,override]
        for i in range(len(self) - 1, -1, -1):
            yield self._make(i)

    def _all(self) -> list[tuple[int, frozenset[str]]]:
        if self.raw:
            for i in range(len(self)):
                self._make(i)
            self.raw = 0
        return list.__getitem__(self, slice(None))

    def __iter__(self):  # type: ignore[no-untyped-def,override]
        return iter(self._all())

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        if isinstance(i, slice):
            return self._all()[i]
        return self._make(i)

    def __eq__(self, other: object) -> bool:
        return self._all() == (other._all() if isinstance(other, _Idents) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._all())

    def __contains__(self, x: object) -> bool:
        return x in self._all()


_ARRAYS = ("turn", "owner", "static", "unique_n", "superseded", "edited_later", "ident_turns_n")
_DICTS = ("value_df", "last_view", "last_edit", "last_command", "ident_first", "value_first", "unedited")
_FLATS = ("values_t", "idents_t", "words_t", "files_t")
_REUSE_ARRAYS = ("reuse_score", "reuse_turns", "reuse_last", "reuse_recent")


def _pack_facts(gf: _GraphFacts) -> dict[str, Any]:
    """The state of ``gf`` as JSON-ready data (numeric arrays as base64 of their bytes), without
    the per-result :class:`_ResultFacts` (rebuilt on demand, :class:`_Facts`) and the task (per
    render). The observed-reuse state is the one :func:`_read_reuse` left: read up to its
    ``reuse_read`` entries of the graph's TFA index (:attr:`~historygraph.signals.reuse.ReuseIndex.touched`,
    appended to in message order, so the same prefix on a graph reopened with these messages)."""
    rows = list(gf.row_of)
    data: dict[str, Any] = {"upto": gf.upto, "encoding": gf.encoding, "rows": rows,
                            "unique": [gf.unique[p] for p in rows],
                            "ident_turns": [[p, t] for p, t in gf.ident_turns.items()],
                            "assistant_idents": [[t, sorted(ids)] for t, ids in gf.assistant_idents],
                            "reuse_read": gf.reuse_read,
                            "reuse_seen": [[p, read, turns] for p, (read, turns) in gf.reuse_seen.items()]}
    for name in _DICTS:
        data[name] = getattr(gf, name)
    for name in _ARRAYS + _REUSE_ARRAYS:
        data[name] = pack_array(getattr(gf, name).view())
    for name in _FLATS:
        fl: _Flat = getattr(gf, name)
        fl._flush()
        if fl.ids.n > fl._indexed:  # the postings complete, so a reopened graph does not sort them again
            fl._index()
        data[name] = [list(fl.vocab), pack_array(fl.rows.view()), pack_array(fl.ids.view()), pack_array(fl.own.view()),
                      pack_array(fl.df.view()), fl._indexed, pack_array(fl._post_rows), pack_array(fl._post_own),
                      pack_array(fl._indptr)]
    return data


_Packed = tuple[str, list[int], bytes, str]  # pack_array's list, its base64 decoded by msgspec (faster than base64)
_PackedFlat = tuple[list[str], _Packed, _Packed, _Packed, _Packed, int, _Packed, _Packed, _Packed]


class _Snapshot(msgspec.Struct):
    """The shape of :func:`_pack_facts`' JSON, for a typed decode (a row of another shape is not one)."""

    upto: int
    encoding: str
    rows: list[int]
    unique: list[int]
    ident_turns: list[tuple[int, list[int]]]
    assistant_idents: list[list[Any]]
    reuse_read: int
    reuse_seen: list[tuple[int, int, list[int]]]
    value_df: dict[str, int]
    last_view: dict[str, int]
    last_edit: dict[str, int]
    last_command: dict[str, int]
    ident_first: dict[str, int]
    value_first: dict[str, int]
    unedited: dict[str, list[int]]
    turn: _Packed
    owner: _Packed
    static: _Packed
    unique_n: _Packed
    superseded: _Packed
    edited_later: _Packed
    ident_turns_n: _Packed
    reuse_score: _Packed
    reuse_turns: _Packed
    reuse_last: _Packed
    reuse_recent: _Packed
    values_t: _PackedFlat
    idents_t: _PackedFlat
    words_t: _PackedFlat
    files_t: _PackedFlat


_decode_snapshot = msgspec.json.Decoder(_Snapshot).decode


def _unpacked(a: _Packed) -> np.ndarray:
    """:func:`~historygraph.history.derived.unpack_array` of a packed array whose bytes are decoded (writeable)."""
    dtype, shape, data, stored = a
    return np.frombuffer(data, dtype=np.dtype(stored)).astype(np.dtype(dtype)).reshape(shape)


def _read_snapshot(text: str | None) -> _Snapshot | None:
    """The stored snapshot's JSON ``text`` decoded, or ``None`` (none, or not of its shape)."""
    if text is None:
        return None
    try:
        return _decode_snapshot(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _unpack_facts(graph: ContextGraph, counter: TokenCounter, data: _Snapshot | None) -> _GraphFacts | None:
    """The :class:`_GraphFacts` of a snapshot (:func:`_pack_facts`) of ``graph``'s first ``upto``
    messages, or ``None`` when it is not one: another encoding, or results at other positions."""
    msgs = graph.messages
    if data is None or data.encoding != counter.encoding_name or not 0 < data.upto <= len(msgs):
        return None
    upto, rows = data.upto, data.rows
    # the tool results before upto: every result is its call's latest or one it replaced
    tools = np.concatenate([np.fromiter(graph.result_of.values(), dtype=np.int64, count=len(graph.result_of)),
                            np.fromiter(graph.superseded, dtype=np.int64, count=len(graph.superseded))])
    tools.sort()
    if rows != tools[:np.searchsorted(tools, upto)].tolist():
        return None
    gf = _GraphFacts(upto=upto, encoding=data.encoding, kept=upto)
    gf.row_of = dict(zip(rows, range(len(rows))))
    gf.positions = list(rows)
    gf.unique = dict(zip(rows, data.unique))
    gf.ident_turns = dict(data.ident_turns)
    gf.assistant_idents = _Idents(data.assistant_idents)  # each entry made when first read
    for name in _DICTS:
        setattr(gf, name, getattr(data, name))
    for name in _ARRAYS + _REUSE_ARRAYS:  # reuse: as read up to entry reuse_read of the graph's TFA index
        setattr(gf, name, _grow_of(_unpacked(getattr(data, name))))
    for name in _FLATS:
        vocab, rows_, ids, own, df, indexed, post_rows, post_own, indptr = getattr(data, name)
        fl = _Flat()
        fl.vocab = dict(zip(vocab, range(len(vocab))))
        fl.rows, fl.ids, fl.own, fl.df = (_grow_of(_unpacked(x)) for x in (rows_, ids, own, df))
        fl._indexed = indexed
        fl._post_rows, fl._post_own, fl._indptr = (_unpacked(x) for x in (post_rows, post_own, indptr))
        setattr(gf, name, fl)
    gf.reuse_read = data.reuse_read
    gf.reuse_seen = {p: (read, turns) for p, read, turns in data.reuse_seen}
    gf.facts.lazy, gf.facts.lazy_set = rows, set(rows)
    gf.facts.source = (msgs, graph.call_owner, graph.reuse, counter, gf.value_first, gf.ident_first)
    return gf


def _new_facts(graph: ContextGraph, counter: TokenCounter) -> _GraphFacts:
    """The state of a graph not seen before: from its stored snapshot when there is a valid one."""
    if graph.derived.persist and type(counter) is TokenCounter:
        gf = _unpack_facts(graph, counter, _read_snapshot(graph.derived.take_text(FACTS_SNAPSHOT, 0)))
        if gf is not None:
            return gf
    return _GraphFacts(encoding=counter.encoding_name)


def _keep_facts(graph: ContextGraph, gf: _GraphFacts, counter: TokenCounter) -> None:
    """Put ``gf``'s snapshot for the store to write when the graph has grown by a quarter since the
    last one (read or put)."""
    n = gf.upto
    if graph.derived.persist and type(counter) is TokenCounter and snapshot_due(n, gf.kept):
        _read_reuse(gf, graph)  # every row exists: the snapshot holds the reuse state up to now
        graph.derived.put_json(FACTS_SNAPSHOT, 0, msgspec.json.encode(_pack_facts(gf)).decode())
        gf.kept = n


def graph_facts(graph: ContextGraph, counter: TokenCounter) -> _GraphFacts:
    gf = _CACHE.get(graph)
    if gf is None or gf.encoding != counter.encoding_name or gf.upto > len(graph):
        gf = _CACHE[graph] = _new_facts(graph, counter)
    msgs = graph.messages
    if gf.upto == len(msgs):
        return gf
    if gf.upto == 0:
        graph.derived.table(RESULT_FACTS)  # every row, decoded at once
    take = graph.derived.take_value
    base = len(gf.row_of)
    new = sum(m.role == "tool" for m in msgs[gf.upto:])
    for grown in (gf.turn, gf.owner, gf.static, gf.superseded, gf.edited_later, gf.ident_turns_n, gf.unique_n,
                  gf.reuse_score, gf.reuse_turns, gf.reuse_last, gf.reuse_recent):
        grown.reserve(new)  # rows base … base + new − 1, filled below
    turns: list[int] = []
    owners: list[int] = []
    statics: list[list[float]] = []
    for p in range(gf.upto, len(msgs)):
        m = msgs[p]
        if m.role == "assistant":
            row = take(RESULT_FACTS, p)
            if row is not None:
                ids = frozenset(row[0])
            else:
                ids = identifiers_in("\n".join(operations(m)))
                graph.derived.put(RESULT_FACTS, p, [sorted(ids)])
            turn = graph.turn_of[p]
            gf.assistant_idents.append((turn, ids))
            for r in {gf.ident_first[i] for i in ids if i in gf.ident_first}:
                seen = gf.ident_turns.setdefault(r, [])
                if not seen or seen[-1] != turn:  # turns only grow
                    gf.ident_turns_n.a[gf.row_of[r]] += 1
                seen.append(turn)
            continue
        if m.role != "tool":
            continue
        owner = graph.call_owner.get(m.tool_call_id or "", p)
        call = next((c for c in msgs[owner].tool_calls if c.id == m.tool_call_id), None) if owner != p else None
        row = take(RESULT_FACTS, p)
        if row is not None:
            kind, command, cfiles, content_files, idents, words_ = (row[0], row[1], frozenset(row[2]), frozenset(row[3]),
                                                                    frozenset(row[4]), frozenset(row[5]))
            error = row[6]
        else:
            kind, command, cfiles, content_files, idents, words_, error = _extract_facts(m, call)
            graph.derived.put(RESULT_FACTS, p, [kind, command, sorted(cfiles), sorted(content_files), sorted(idents),
                                                sorted(words_), error])
        values = graph.reuse.values[p]
        own_idents = frozenset(i for i in idents if i not in gf.ident_first)
        f = _ResultFacts(position=p, owner=owner, values=values, own_values=frozenset(v for v in values if v not in gf.value_df),
                         idents=idents, own_idents=own_idents, words=words_,
                         kind=kind, command=command, files=cfiles,
                         shown_files=cfiles | (content_files if kind != "search" else frozenset()), content_files=content_files,
                         tokens=counter.count(m.content), error=error)
        gf.facts[p] = f
        row = gf.row_of[p] = len(gf.row_of)
        gf.positions.append(p)
        turns.append(graph.turn_of[p])
        owners.append(owner)
        statics.append([math.log1p(f.tokens), *(float(kind == k) for k in KINDS), math.log1p(len(values)),
                        float(f.error), math.log1p(len(f.own_values)), math.log1p(len(own_idents))])
        gf.values_t.add(row, values, f.own_values)
        gf.idents_t.add(row, idents, own_idents)
        gf.words_t.add(row, sorted(f.words))
        gf.files_t.add(row, f.shown_files)
        gf.unique[p] = 0
        for v in f.values:
            df = gf.value_df.get(v, 0)
            if df == 0:
                gf.value_first[v] = p
                gf.unique[p] += 1
            elif df == 1:
                first = gf.value_first[v]
                gf.unique[first] -= 1
                gf.unique_n.a[gf.row_of[first]] -= 1
            gf.value_df[v] = df + 1
        gf.unique_n.a[row] = gf.unique[p]
        for i in own_idents:
            gf.ident_first[i] = p
        for name_ in cfiles:
            if kind == "view":
                prev = gf.last_view.get(name_)
                if prev is not None:  # an earlier view of the file is stale now
                    gf.superseded.a[gf.row_of[prev]] = 1.0
                gf.last_view[name_] = p
            elif kind == "edit":
                for r in gf.unedited.pop(name_, ()):  # every earlier result showing the file
                    gf.edited_later.a[r] = 1.0
                gf.last_edit[name_] = p
        for name_ in f.shown_files:
            gf.unedited.setdefault(name_, []).append(row)
        if f.command:
            key = command_key(f.command)
            prev = gf.last_command.get(key)
            if prev is not None:  # the same command was run again
                gf.superseded.a[gf.row_of[prev]] = 1.0
            gf.last_command[key] = p
    if new:
        gf.turn.a[base:base + new] = turns
        gf.owner.a[base:base + new] = owners
        gf.static.a[base:base + new] = statics
    gf.upto = len(msgs)
    _keep_facts(graph, gf, counter)
    return gf


def _read_reuse(gf: _GraphFacts, graph: ContextGraph) -> None:
    """Bring the per-row reuse state up to date with the results whose matches or score changed
    since it was last read (:attr:`~historygraph.signals.reuse.ReuseIndex.touched`)."""
    reuse = graph.reuse
    touched = reuse.touched
    if gf.reuse_read >= len(touched):
        return
    turn_of = graph.turn_of
    for p in set(touched[gf.reuse_read:]):
        row = gf.row_of.get(p)
        ms = reuse.matches.get(p)
        if not ms or row is None:
            continue
        read, turns = gf.reuse_seen.get(p, (0, []))
        if read < len(ms):  # matches come in message order: their turns never decrease
            turns = list(turns)
            for m in ms[read:]:
                x = turn_of[m.user]
                if not turns or turns[-1] != x:
                    turns.append(x)
            gf.reuse_seen[p] = (len(ms), turns)
        gf.reuse_score.a[row] = math.log1p(reuse.score(p))
        gf.reuse_turns.a[row] = len(turns)
        gf.reuse_last.a[row] = turns[-1]
        latest = turns[:-RECENT_TURNS - 1:-1]
        gf.reuse_recent.a[row, :len(latest)] = latest
    gf.reuse_read = len(touched)


def _query_ids(flat: "_Flat", query: frozenset[str]) -> np.ndarray:
    """``[flat.vocab.get(w, -1) for w in sorted(query)]`` (intp), kept on ``flat`` per query (the
    task's words are asked for at every render): an id never changes, so when the vocabulary has
    grown only the words unknown before are looked up again. The kept array is never changed
    in place (a grown vocabulary gives a new one)."""
    vocab = flat.vocab
    kept: dict[int, tuple[frozenset[str], dict[str, int], int, list[str], np.ndarray]] | None = \
        getattr(flat, "_queries", None)
    if kept is None:
        kept = flat._queries = {}
    hit = kept.get(id(query))
    if hit is not None and hit[0] is query and hit[1] is vocab:
        _, _, size, ordered, ids = hit
        if size != len(vocab):
            ids = ids.copy()
            for j in (ids < 0).nonzero()[0].tolist():
                ids[j] = vocab.get(ordered[j], -1)
            kept[id(query)] = (query, vocab, len(vocab), ordered, ids)
        return ids
    ordered = sorted(query)
    get = vocab.get
    ids = np.fromiter((get(w, -1) for w in ordered), dtype=np.intp, count=len(ordered))
    if len(kept) >= 8:  # the task's and a few latest messages'
        kept.clear()
    kept[id(query)] = (query, vocab, len(vocab), ordered, ids)
    return ids


def cover_weights(gf: _GraphFacts, query: frozenset[str], df: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The IDF weight ``ln(1 + N / (1 + df(w)))`` of each word of ``query`` (``N`` the results stored
    so far, ``df`` :meth:`_Flat.counts` of the words): the vocabulary ids of its known words and
    their weights, in sorted word order (the order each row holds its words in, so that
    :meth:`_Flat.sums` adds a row's terms in sorted word order), and the IDF mass of ``query``: its
    words' weights added left to right in sorted word order (so the figure does not depend on the
    order Python iterates a set in). Each distinct ``df`` is put through :mod:`math` once (numpy's
    ``log`` may round differently)."""
    n_docs = max(1, len(gf.facts))
    ids = _query_ids(gf.words_t, query)
    known = ids >= 0
    dfq = np.zeros(len(ids), dtype=np.int64)
    dfq[known] = df[ids[known]]
    distinct, inverse = np.unique(dfq, return_inverse=True)
    idf = np.array([math.log(1.0 + n_docs / (1.0 + d)) for d in distinct.tolist()])[inverse]
    return ids[known], idf[known], float(np.cumsum(idf)[-1]) if len(idf) else 0.0  # cumsum adds left to right


def _task(gf: _GraphFacts, text: str, graph: ContextGraph | None = None,
          position: int | None = None) -> tuple[str, frozenset[str], frozenset[str], frozenset[str]]:
    """The task's text and its values, words and identifiers, kept per graph (``position``: the
    task message's, whose :data:`TASK_FACTS` row is read or put when the graph is from a store)."""
    if gf.task is None or gf.task[0] is not text:
        derived = graph.derived if graph is not None and position is not None and graph.derived.persist else None
        row = derived.take_value(TASK_FACTS, position) if derived is not None and position is not None else None
        if type(row) is list and len(row) == 3 and all(type(x) is list for x in row):
            gf.task = (text, frozenset(row[0]), frozenset(row[1]), frozenset(row[2]))
        else:
            gf.task = (text, frozenset(extract_values(text)), words(text), identifiers_in(text))
            if derived is not None and position is not None:
                derived.put(TASK_FACTS, position, [sorted(x) for x in gf.task[1:]])
    return gf.task


_COL = {name: k for k, name in enumerate(FEATURES)}


_recency = IntTable(lambda a: math.exp(-0.3 * a))
_log2p = IntTable(lambda a: math.log(2 + a))


def feature_matrix(graph: ContextGraph, positions: list[int], counter: TokenCounter) -> np.ndarray:
    """Features (:data:`FEATURES`, in that order) of the tool results at ``positions`` for the next
    invocation of ``graph``; shape ``(len(positions), len(FEATURES))``, float64.

    Computed for every stored result at once from the per-graph arrays of :class:`_GraphFacts`
    (``tests/test_equivalence.py`` checks it against the per-result formulas of the module
    docstring on real traces).

    Raises:
        KeyError: a position that is not a stored tool result.
    """
    gf = graph_facts(graph, counter)
    stored = gf.positions  # result positions by row
    if isinstance(positions, list) and len(positions) <= len(stored) and positions == stored[:len(positions)]:
        # the first rows in order (a layout's candidates, mostly)
        rows = np.arange(len(positions), dtype=np.intp)
    else:
        rows = np.fromiter(map(gf.row_of.__getitem__, positions), dtype=np.intp, count=len(positions))
    msgs = graph.messages
    t = graph.turns
    n = len(gf.row_of)
    task_at = next((p for p, m in enumerate(msgs) if m.role == "user"), None)
    task_text = msgs[task_at].content if task_at is not None else ""
    latest = next((p for p in range(len(msgs) - 1, -1, -1) if msgs[p].role == "assistant"), None)
    latest_text = "\n".join(operations(msgs[latest])) if latest is not None else ""
    _, task_values, task_words, task_idents = _task(gf, task_text, graph, task_at)
    # the values of the latest message's operations, as TFA took them when it was added: a candidate
    # never spans the newline that joins them, so their union is extract_values(latest_text)
    ops = graph.latest_operations
    latest_values = frozenset().union(*ops[1]) if ops is not None and ops[0] == latest else extract_values(latest_text)
    latest_words = words(latest_text)
    latest_files = files_in(latest_text)
    latest_idents = identifiers_in(latest_text)
    out = np.zeros((n, len(FEATURES)))

    def col(name: str, x: np.ndarray | float) -> None:
        out[:, _COL[name]] = x

    turn = gf.turn.view()
    age = t - turn
    col("age", age)
    col("log_age", LOG1P(age))
    col("recency", _recency(age))
    # observed reuse (TFA): only the results with matches differ from the never-reused defaults
    col("since_reuse", _log2p(age))
    col("never_reused", 1.0)
    _read_reuse(gf, graph)
    n_turns = gf.reuse_turns.view()
    hit = np.flatnonzero(n_turns)
    if len(hit):
        last, nt = gf.reuse_last.view()[hit], n_turns[hit]
        recent = (gf.reuse_recent.view()[hit] > t - RECENT_TURNS) & (np.arange(RECENT_TURNS) < nt[:, None])
        out[hit, _COL["reuse_score"]] = gf.reuse_score.view()[hit]
        out[hit, _COL["reuse_turns"]] = LOG1P(nt)
        out[hit, _COL["reused_last"]] = last == t
        out[hit, _COL["reused_recent"]] = recent.sum(1)
        out[hit, _COL["since_reuse"]] = LOG1P(t - last)
        out[hit, _COL["never_reused"]] = 0.0
    # lexical and value overlap with the latest assistant message and the task, identifiers, files,
    # and echoes in the newest results (0 for the newest results themselves): each table's sums
    # in one pass (_Flat.sums_many)
    vt, it, wt, ft = gf.values_t, gf.idents_t, gf.words_t, gf.files_t
    fresh = [gf.facts[q] for q in range(latest + 1, len(msgs)) if q in gf.facts] if latest is not None else []
    fresh_values = frozenset().union(*(f.values for f in fresh))
    fresh_idents = frozenset().union(*(f.idents for f in fresh))
    fresh_files = frozenset().union(*(f.content_files for f in fresh))
    q_values = vt.lookup(fresh_values)
    v_latest, v_task, v_echo, v_echo_own = vt.sums_many(
        [(vt.lookup(latest_values), None, False), (vt.lookup(task_values), None, False),
         (q_values, None, False), (q_values, None, True)], n)
    col("latest_values", LOG1P(v_latest))
    col("task_values", LOG1P(v_task))
    df = wt.counts()
    covers = [(name, *cover_weights(gf, query, df)) for name, query in (("latest_cover", latest_words),
                                                                         ("task_cover", task_words))]
    covers = [c for c in covers if c[3] > 0]
    if covers:
        for (name, _, _, total), x in zip(covers, wt.sums_many([(ids, idf, False) for _, ids, idf, _ in covers], n)):
            col(name, x / total)
    static = gf.static.view()
    for to, frm in _STATIC_BLOCKS:
        out[:, to] = static[:, frm]
    out[[gf.row_of[p] for p in latest_ancestry_results(graph, ANCESTRY_STEPS) if p in gf.row_of], _COL["ancestor"]] = 1.0
    col("superseded", gf.superseded.view())
    col("edited_later", gf.edited_later.view())
    f_latest, f_echo = ft.sums_many([(ft.lookup(latest_files), None, False), (ft.lookup(fresh_files), None, False)], n)
    col("path_in_latest", f_latest > 0)
    col("unique_values", LOG1P(gf.unique_n.view()))
    owner = gf.owner.view()
    newest = owner == latest if latest is not None else np.zeros(n, bool)
    col("latest_result", newest)
    col("ident_turns", LOG1P(gf.ident_turns_n.view()))
    q_latest = it.lookup(latest_idents)
    recent = []  # the identifiers of the last RECENT_TURNS assistant messages, once per message naming them
    for turn_, ids_ in reversed(gf.assistant_idents):
        if turn_ <= t - RECENT_TURNS:
            break
        recent.append(it.lookup(ids_))
    q_recent, times = np.unique(np.concatenate(recent), return_counts=True) if recent else (np.zeros(0, np.intp), None)
    i_latest, i_latest_own, i_recent_own, i_task, i_echo_own = it.sums_many(
        [(q_latest, None, False), (q_latest, None, True), (q_recent, times, True),
         (it.lookup(task_idents), None, False), (it.lookup(fresh_idents), None, True)], n)
    col("latest_idents", LOG1P(i_latest))
    col("latest_own_idents", LOG1P(i_latest_own))
    col("recent_own_idents", LOG1P(i_recent_own))
    col("task_idents", LOG1P(i_task))
    keep = ~newest
    col("echo_values", LOG1P(v_echo) * keep)
    col("echo_own_values", LOG1P(v_echo_own) * keep)
    col("echo_own_idents", LOG1P(i_echo_own) * keep)
    col("echo_files", (f_echo > 0) & keep)
    if len(rows) and rows[-1] == len(rows) - 1 and (rows == np.arange(len(rows))).all():
        return out[:len(rows)]  # the first rows in order (every result but the newest protected ones)
    return out[rows]
