"""The per-graph cache of the learned selector's facts (:func:`graph_facts`) and the task's facts
(:func:`task_facts`).

Per-result facts that do not change (values, words, kind, files, tokens) are computed once per
graph and extended incrementally (the graph is append-only), so a render costs ``O(n)`` small
set operations for ``n`` stored results. The regular-expression part of them (kind, command, files,
identifiers, words, error; the values are the graph's TFA values) is kept with a stored session
as :data:`~historygraph.policies.learned.stored_kinds.RESULT_FACTS` rows
(:mod:`historygraph.history.derived`), so a reopened session reads it; the per-graph state itself is
kept as one :data:`~historygraph.policies.learned.stored_kinds.FACTS_SNAPSHOT` row
(:mod:`historygraph.policies.learned.snapshot`), rewritten when the session has grown by a
quarter, so a reopened session's first render starts from it and extends it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from historygraph.history.derived import DerivedKind
from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph, operations
from historygraph.policies.learned.graph_state import GraphFacts
from historygraph.policies.learned.result_facts import KINDS, ResultFacts, command_key, extract_facts, words
from historygraph.policies.learned.snapshot import keep_facts, new_facts
from historygraph.policies.learned.stored_kinds import RESULT_FACTS, TASK_FACTS
from historygraph.history.reuse import extract_values
from historygraph.signals.steps.features import identifiers_in
from historygraph.signals.tokens import TokenCounter

_FACTS = "learned.graph_facts"  # graph.memo key: {"facts": the GraphFacts}


def graph_facts(graph: ContextGraph, counter: TokenCounter) -> GraphFacts:
    """The per-graph state of ``graph`` (kept per graph, weakly), extended with the messages added
    since it was last asked for; a graph not seen before starts from its stored snapshot when
    there is a valid one."""
    kept: dict[str, GraphFacts] = graph.memo(_FACTS, dict)
    gf = kept.get("facts")
    if gf is None or gf.encoding != counter.encoding_name or gf.upto > len(graph):
        gf = kept["facts"] = new_facts(graph, counter)
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
            _add_assistant(gf, graph, p, m, take)
            continue
        if m.role != "tool":
            continue
        f = _result_facts(gf, graph, p, m, take, counter)
        gf.facts[p] = f
        row = gf.row_of[p] = len(gf.row_of)
        gf.positions.append(p)
        turns.append(graph.turn_of[p])
        owners.append(f.owner)
        statics.append([math.log1p(f.tokens), *(float(f.kind == k) for k in KINDS), math.log1p(len(f.values)),
                        float(f.error), math.log1p(len(f.own_values)), math.log1p(len(f.own_idents))])
        _add_result(gf, f, row)
    if new:
        gf.turn.a[base:base + new] = turns
        gf.owner.a[base:base + new] = owners
        gf.static.a[base:base + new] = statics
    gf.upto = len(msgs)
    keep_facts(graph, gf, counter)
    return gf


def _add_assistant(gf: GraphFacts, graph: ContextGraph, p: int, m: Message,
                   take: Callable[[DerivedKind, int], Any]) -> None:
    """Add the assistant message ``m`` at ``p``: its identifiers (its stored row's, else extracted
    and put), and its turn to the results first holding one of them."""
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


def _result_facts(gf: GraphFacts, graph: ContextGraph, p: int, m: Message,
                  take: Callable[[DerivedKind, int], Any], counter: TokenCounter) -> ResultFacts:
    """The facts of the tool result ``m`` at ``p`` (its stored row's, else extracted and put), its
    own values and identifiers those no earlier result holds."""
    msgs = graph.messages
    owner = graph.call_owner.get(m.tool_call_id or "", p)
    call = next((c for c in msgs[owner].tool_calls if c.id == m.tool_call_id), None) if owner != p else None
    row = take(RESULT_FACTS, p)
    if row is not None:
        kind, command, cfiles, content_files, idents, words_ = (row[0], row[1], frozenset(row[2]), frozenset(row[3]),
                                                                frozenset(row[4]), frozenset(row[5]))
        error = row[6]
    else:
        kind, command, cfiles, content_files, idents, words_, error = extract_facts(m, call)
        graph.derived.put(RESULT_FACTS, p, [kind, command, sorted(cfiles), sorted(content_files), sorted(idents),
                                            sorted(words_), error])
    values = graph.reuse.values[p]
    own_idents = frozenset(i for i in idents if i not in gf.ident_first)
    return ResultFacts(position=p, owner=owner, values=values,
                       own_values=frozenset(v for v in values if v not in gf.value_df),
                       idents=idents, own_idents=own_idents, words=words_,
                       kind=kind, command=command, files=cfiles,
                       shown_files=cfiles | (content_files if kind != "search" else frozenset()),
                       content_files=content_files, tokens=counter.count(m.content), error=error)


def _add_result(gf: GraphFacts, f: ResultFacts, row: int) -> None:
    """Add the result ``f`` (row ``row``) to the flat tables and the bookkeeping: values no other
    result holds, first holders of identifiers, and what it makes stale (an earlier view of a file
    it views again, a result showing a file it edits, an earlier run of its command)."""
    p = f.position
    gf.values_t.add(row, f.values, f.own_values)
    gf.idents_t.add(row, f.idents, f.own_idents)
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
    for i in f.own_idents:
        gf.ident_first[i] = p
    for name_ in f.files:
        if f.kind == "view":
            prev = gf.last_view.get(name_)
            if prev is not None:  # an earlier view of the file is stale now
                gf.superseded.a[gf.row_of[prev]] = 1.0
            gf.last_view[name_] = p
        elif f.kind == "edit":
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


def task_facts(gf: GraphFacts, text: str, graph: ContextGraph | None = None,
               position: int | None = None) -> tuple[str, frozenset[str], frozenset[str], frozenset[str]]:
    """The task's text and its values, words and identifiers, kept per graph (``position``: the
    task message's, whose :data:`~historygraph.policies.learned.stored_kinds.TASK_FACTS` row is read
    or put when the graph is from a store)."""
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
