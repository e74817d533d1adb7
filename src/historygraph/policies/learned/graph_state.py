"""The learned selector's per-graph state (:class:`GraphFacts`): each stored tool result's facts
(:class:`~historygraph.policies.learned.result_facts.ResultFacts`, built lazily for a state read
from a snapshot), the bookkeeping that extends them as the append-only graph grows (first holders
of each value and identifier, latest views, edits and commands), the same facts as arrays and
flat tables over results in transcript order, and the observed reuse of each result read in from
the graph's TFA index (:func:`read_reuse`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field

import numpy as np

from historygraph.history.graph import ContextGraph
from historygraph.policies.learned.flat_tables import Flat, Grow
from historygraph.policies.learned.result_facts import KINDS, ResultFacts, extract_facts

RECENT_TURNS = 3
STATIC = ("log_tokens", *(f"kind_{k}" for k in KINDS), "log_values", "error", "own_values", "own_idents")
"""The features of a result that do not change between renders, the columns of :attr:`GraphFacts.static`."""


class _Facts(MutableMapping[int, ResultFacts]):
    """:attr:`GraphFacts.facts`: the results' :class:`ResultFacts` by position. Those of a state
    read from a stored snapshot (:mod:`historygraph.policies.learned.snapshot`) are built when
    first asked for, from the message (the same pure functions as a
    :data:`~historygraph.policies.learned.stored_kinds.RESULT_FACTS` row), its graph's TFA values
    and the first holders of each value and identifier (what was a result's own when it was added);
    a render asks for the newest few. Holds the graph's message list, call owners and reuse index,
    not the graph (the per-graph cache is keyed weakly by the graph)."""

    def __init__(self) -> None:
        self.built: dict[int, ResultFacts] = {}
        self.cache: dict[int, ResultFacts] = {}  # the lazy ones built so far
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

    def __getitem__(self, p: int) -> ResultFacts:
        f = self.built.get(p)
        if f is None:
            f = self.cache.get(p)
        if f is not None:
            return f
        if p not in self.lazy_set or self.source is None:
            raise KeyError(p)
        f = self.cache[p] = self._build(p)
        return f

    def _build(self, p: int) -> ResultFacts:
        msgs, call_owner, reuse, counter, value_first, ident_first = self.source  # type: ignore[misc]
        m = msgs[p]
        owner = call_owner.get(m.tool_call_id or "", p)
        call = next((c for c in msgs[owner].tool_calls if c.id == m.tool_call_id), None) if owner != p else None
        kind, command, cfiles, content_files, idents, words_, error = extract_facts(m, call)
        values = reuse.values[p]
        return ResultFacts(position=p, owner=owner, values=values,
                            own_values=frozenset(v for v in values if value_first.get(v) == p),
                            idents=idents, own_idents=frozenset(i for i in idents if ident_first.get(i) == p),
                            words=words_, kind=kind, command=command, files=cfiles,
                            shown_files=cfiles | (content_files if kind != "search" else frozenset()),
                            content_files=content_files, tokens=counter.count(m.content), error=error)

    def __setitem__(self, p: int, f: ResultFacts) -> None:
        self.built[p] = f

    def __delitem__(self, p: int) -> None:
        raise TypeError("facts are only ever added")



@dataclass
class GraphFacts:
    """Per-graph incremental state: facts of each result, word document frequencies, and the
    latest positions at which each file was viewed or edited and each command was run. The same
    facts are also kept as arrays over results in transcript order (row ``i`` is the ``i``-th
    stored result): the features that do not change between renders, the flags that only ever turn
    on (superseded, edited later), and flat tables of each result's values, identifiers, words and
    files (:class:`Flat`), so that a render is a few numpy passes."""

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
    turn: Grow = field(default_factory=lambda: Grow(np.intp))
    owner: Grow = field(default_factory=lambda: Grow(np.intp))
    static: Grow = field(default_factory=lambda: Grow(np.float64, len(STATIC)))
    unique_n: Grow = field(default_factory=lambda: Grow(np.intp))
    superseded: Grow = field(default_factory=lambda: Grow(np.float64))
    edited_later: Grow = field(default_factory=lambda: Grow(np.float64))
    ident_turns_n: Grow = field(default_factory=lambda: Grow(np.intp))  # distinct turns in ident_turns
    unedited: dict[str, list[int]] = field(default_factory=dict)  # file -> rows showing it not yet edited later
    values_t: Flat = field(default_factory=Flat)
    idents_t: Flat = field(default_factory=Flat)
    words_t: Flat = field(default_factory=Flat)   # each row's words in sorted order
    files_t: Flat = field(default_factory=Flat)   # shown files
    reuse_seen: dict[int, tuple[int, list[int]]] = field(default_factory=dict)  # result -> (matches read, distinct reuse turns)
    # observed reuse per row, updated for the results the graph's TFA index lists as changed
    reuse_read: int = 0  # entries of graph.reuse.touched read
    reuse_score: Grow = field(default_factory=lambda: Grow(np.float64))  # ln(1 + c_t(r))
    reuse_turns: Grow = field(default_factory=lambda: Grow(np.intp))     # distinct reusing turns
    reuse_last: Grow = field(default_factory=lambda: Grow(np.intp))      # the latest of them
    reuse_recent: Grow = field(default_factory=lambda: Grow(np.intp, RECENT_TURNS))  # the latest RECENT_TURNS, newest first


def read_reuse(gf: GraphFacts, graph: ContextGraph) -> None:
    """Bring the per-row reuse state up to date with the results whose matches or score changed
    since it was last read (:attr:`~historygraph.history.reuse.ReuseIndex.touched`)."""
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

