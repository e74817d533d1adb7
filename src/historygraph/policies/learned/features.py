"""Render-time features of a tool result for the learned selector (ours, beyond the papers).

Every feature is computed from what a production system has when it renders the history for
invocation ``t`` (``t = graph.turns``): the stored messages, their tool calls, and the observed
reuse of Tool-Flow Analysis (TFA, "ContextRender: From Execution Dependencies to Agent Context", arXiv:2609.37743,
§3.2 and A.2; here
:mod:`historygraph.history.reuse`). Nothing reads the future and nothing uses the evaluator's
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
* ``kind_*``: the kind of tool call that produced ``r``
  (:func:`~historygraph.policies.learned.result_facts.call_kind`): ``view`` (cat, sed -n, head, an
  editor's view), ``search`` (grep, find, ls), ``edit`` (sed -i, heredoc writes, editor
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
graph and extended incrementally (:mod:`historygraph.policies.learned.facts_cache`), so a render
costs ``O(n)`` small set operations for ``n`` stored results. The regular-expression part of them
(kind, command, files, identifiers, words, error; :mod:`historygraph.policies.learned.result_facts`;
the values are the graph's TFA values) is kept with a stored session as
:data:`~historygraph.policies.learned.stored_kinds.RESULT_FACTS` rows (:mod:`historygraph.history.derived`),
so a reopened session reads it; the per-graph state itself
(:mod:`historygraph.policies.learned.graph_state`) is kept as one
:data:`~historygraph.policies.learned.stored_kinds.FACTS_SNAPSHOT` row
(:mod:`historygraph.policies.learned.snapshot`), rewritten when the session has grown by a quarter,
so a reopened session's first render starts from it and extends it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from historygraph.history.graph import ContextGraph, operations
from historygraph.policies.learned.facts_cache import graph_facts, task_facts
from historygraph.policies.learned.flat_tables import query_ids
from historygraph.policies.learned.graph_state import RECENT_TURNS, STATIC, GraphFacts, read_reuse
from historygraph.policies.learned.result_facts import ResultFacts, words
from historygraph.signals.int_table import LOG1P, IntTable
from historygraph.history.reuse import extract_values
from historygraph.signals.steps.features import files_in, identifiers_in
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
ANCESTRY_STEPS = 10   # W of the ancestry feature (ContextWeaver §3.1; the value contextrender-dep uses)

_COL = {name: k for k, name in enumerate(FEATURES)}


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


_STATIC_BLOCKS = _blocks(STATIC)


def cover_weights(gf: GraphFacts, query: frozenset[str], df: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The IDF weight ``ln(1 + N / (1 + df(w)))`` of each word of ``query`` (``N`` the results stored
    so far, ``df`` :meth:`~historygraph.policies.learned.flat_tables.Flat.counts` of the words): the vocabulary ids of its known words and
    their weights, in sorted word order (the order each row holds its words in, so that
    :meth:`~historygraph.policies.learned.flat_tables.Flat.sums` adds a row's terms in sorted word order), and the IDF mass of ``query``: its
    words' weights added left to right in sorted word order (so the figure does not depend on the
    order Python iterates a set in). Each distinct ``df`` is put through :mod:`math` once (numpy's
    ``log`` may round differently)."""
    n_docs = max(1, len(gf.facts))
    ids = query_ids(gf.words_t, query)
    known = ids >= 0
    dfq = np.zeros(len(ids), dtype=np.int64)
    dfq[known] = df[ids[known]]
    distinct, inverse = np.unique(dfq, return_inverse=True)
    idf = np.array([math.log(1.0 + n_docs / (1.0 + d)) for d in distinct.tolist()])[inverse]
    return ids[known], idf[known], float(np.cumsum(idf)[-1]) if len(idf) else 0.0  # cumsum adds left to right


_recency = IntTable(lambda a: math.exp(-0.3 * a))
_log2p = IntTable(lambda a: math.log(2 + a))


def feature_matrix(graph: ContextGraph, positions: list[int], counter: TokenCounter) -> np.ndarray:
    """Features (:data:`FEATURES`, in that order) of the tool results at ``positions`` for the next
    invocation of ``graph``; shape ``(len(positions), len(FEATURES))``, float64.

    Computed for every stored result at once from the per-graph arrays of
    :class:`~historygraph.policies.learned.graph_state.GraphFacts` (``tests/test_equivalence.py``
    checks it against the per-result formulas of the module docstring on real traces).

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
    q = _query(graph, gf)
    n = len(gf.row_of)
    out = np.zeros((n, len(FEATURES)))
    _reuse_columns(out, gf, graph, q.t)
    # lexical and value overlap with the latest assistant message and the task, identifiers, files,
    # and echoes in the newest results (0 for the newest results themselves): each table's sums
    # in one pass (Flat.sums_many)
    msgs = graph.messages
    fresh = [gf.facts[p] for p in range(q.latest + 1, len(msgs)) if p in gf.facts] if q.latest is not None else []
    v_echo, v_echo_own = _value_columns(out, gf, q, fresh)
    _static_columns(out, gf, graph)
    ft = gf.files_t
    f_latest, f_echo = ft.sums_many([(ft.lookup(q.latest_files), None, False),
                                     (ft.lookup(frozenset().union(*(f.content_files for f in fresh))), None, False)], n)
    _col(out, "path_in_latest", f_latest > 0)
    _col(out, "unique_values", LOG1P(gf.unique_n.view()))
    owner = gf.owner.view()
    newest = owner == q.latest if q.latest is not None else np.zeros(n, bool)
    _col(out, "latest_result", newest)
    _col(out, "ident_turns", LOG1P(gf.ident_turns_n.view()))
    i_echo_own = _ident_columns(out, gf, q, fresh)
    keep = ~newest
    _col(out, "echo_values", LOG1P(v_echo) * keep)
    _col(out, "echo_own_values", LOG1P(v_echo_own) * keep)
    _col(out, "echo_own_idents", LOG1P(i_echo_own) * keep)
    _col(out, "echo_files", (f_echo > 0) & keep)
    if len(rows) and rows[-1] == len(rows) - 1 and (rows == np.arange(len(rows))).all():
        return out[:len(rows)]  # the first rows in order (every result but the newest protected ones)
    return out[rows]


def _col(out: np.ndarray, name: str, x: np.ndarray | float) -> None:
    out[:, _COL[name]] = x


@dataclass(frozen=True)
class _Query:
    """What a render compares the results with: the next invocation ``t``, the latest assistant
    message's position (``None``: none yet) and its values, words, files and identifiers, and the
    task's values, words and identifiers."""

    t: int
    latest: int | None
    latest_values: set[str] | frozenset[str]  # (frozenset: as TFA took them)
    latest_words: frozenset[str]
    latest_files: frozenset[str]
    latest_idents: frozenset[str]
    task_values: frozenset[str]
    task_words: frozenset[str]
    task_idents: frozenset[str]


def _query(graph: ContextGraph, gf: GraphFacts) -> _Query:
    """The :class:`_Query` of a render of ``graph``."""
    msgs = graph.messages
    task_at = next((p for p, m in enumerate(msgs) if m.role == "user"), None)
    task_text = msgs[task_at].content if task_at is not None else ""
    latest = next((p for p in range(len(msgs) - 1, -1, -1) if msgs[p].role == "assistant"), None)
    latest_text = "\n".join(operations(msgs[latest])) if latest is not None else ""
    _, task_values, task_words, task_idents = task_facts(gf, task_text, graph, task_at)
    # the values of the latest message's operations, as TFA took them when it was added: a candidate
    # never spans the newline that joins them, so their union is extract_values(latest_text)
    ops = graph.latest_operations
    latest_values = frozenset().union(*ops[1]) if ops is not None and ops[0] == latest else extract_values(latest_text)
    return _Query(t=graph.turns, latest=latest, latest_values=latest_values, latest_words=words(latest_text),
                  latest_files=files_in(latest_text), latest_idents=identifiers_in(latest_text),
                  task_values=task_values, task_words=task_words, task_idents=task_idents)


def _reuse_columns(out: np.ndarray, gf: GraphFacts, graph: ContextGraph, t: int) -> None:
    """Age and observed reuse (TFA): only the results with matches differ from the never-reused
    defaults."""
    turn = gf.turn.view()
    age = t - turn
    _col(out, "age", age)
    _col(out, "log_age", LOG1P(age))
    _col(out, "recency", _recency(age))
    _col(out, "since_reuse", _log2p(age))
    _col(out, "never_reused", 1.0)
    read_reuse(gf, graph)
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


def _value_columns(out: np.ndarray, gf: GraphFacts, q: _Query,
                   fresh: list[ResultFacts]) -> tuple[np.ndarray, np.ndarray]:
    """The value overlaps with the latest message and the task and the IDF-weighted word covers;
    returns the sums of the values (all, and own only) echoed in the newest results ``fresh``."""
    n = len(out)
    vt, wt = gf.values_t, gf.words_t
    q_values = vt.lookup(frozenset().union(*(f.values for f in fresh)))
    v_latest, v_task, v_echo, v_echo_own = vt.sums_many(
        [(vt.lookup(q.latest_values), None, False), (vt.lookup(q.task_values), None, False),
         (q_values, None, False), (q_values, None, True)], n)
    _col(out, "latest_values", LOG1P(v_latest))
    _col(out, "task_values", LOG1P(v_task))
    df = wt.counts()
    covers = [(name, *cover_weights(gf, query, df)) for name, query in (("latest_cover", q.latest_words),
                                                                         ("task_cover", q.task_words))]
    covers = [c for c in covers if c[3] > 0]
    if covers:
        for (name, _, _, total), x in zip(covers, wt.sums_many([(ids, idf, False) for _, ids, idf, _ in covers], n)):
            _col(out, name, x / total)
    return v_echo, v_echo_own


def _static_columns(out: np.ndarray, gf: GraphFacts, graph: ContextGraph) -> None:
    """The columns kept per result (:data:`~historygraph.policies.learned.graph_state.STATIC`),
    the ancestry of the current step and the flags that only ever turn on."""
    static = gf.static.view()
    for to, frm in _STATIC_BLOCKS:
        out[:, to] = static[:, frm]
    ancestry = [gf.row_of[p] for p in latest_ancestry_results(graph, ANCESTRY_STEPS) if p in gf.row_of]
    out[ancestry, _COL["ancestor"]] = 1.0
    _col(out, "superseded", gf.superseded.view())
    _col(out, "edited_later", gf.edited_later.view())


def _ident_columns(out: np.ndarray, gf: GraphFacts, q: _Query, fresh: list[ResultFacts]) -> np.ndarray:
    """The identifier overlaps with the latest message, the last :data:`RECENT_TURNS` assistant
    messages and the task; returns the sums of the own identifiers echoed in the newest results
    ``fresh``."""
    n, t, it = len(out), q.t, gf.idents_t
    q_latest = it.lookup(q.latest_idents)
    recent = []  # the identifiers of the last RECENT_TURNS assistant messages, once per message naming them
    for turn_, ids_ in reversed(gf.assistant_idents):
        if turn_ <= t - RECENT_TURNS:
            break
        recent.append(it.lookup(ids_))
    q_recent, times = np.unique(np.concatenate(recent), return_counts=True) if recent else (np.zeros(0, np.intp), None)
    i_latest, i_latest_own, i_recent_own, i_task, i_echo_own = it.sums_many(
        [(q_latest, None, False), (q_latest, None, True), (q_recent, times, True),
         (it.lookup(q.task_idents), None, False), (it.lookup(frozenset().union(*(f.idents for f in fresh))), None, True)],
        n)
    _col(out, "latest_idents", LOG1P(i_latest))
    _col(out, "latest_own_idents", LOG1P(i_latest_own))
    _col(out, "recent_own_idents", LOG1P(i_recent_own))
    _col(out, "task_idents", LOG1P(i_task))
    return i_echo_own
