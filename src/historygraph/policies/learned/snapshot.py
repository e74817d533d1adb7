"""The learned selector's per-graph state (:class:`~historygraph.policies.learned.graph_state.GraphFacts`)
kept with a stored session as one :data:`~historygraph.policies.learned.stored_kinds.FACTS_SNAPSHOT`
row: packed as JSON (numeric arrays as base64 of their bytes), put when the session has grown by a
quarter since the last one (:func:`keep_facts`), and read back, checked against the graph's
results, for a graph not seen before in this process (:func:`new_facts`); the per-result facts and
the assistant messages' identifiers are built from it only when first read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, SupportsIndex, overload

import msgspec
import numpy as np

from historygraph.history.derived import pack_array, snapshot_due
from historygraph.history.graph import ContextGraph
from historygraph.policies.learned.flat_tables import Flat, grow_of
from historygraph.policies.learned.graph_state import GraphFacts, read_reuse
from historygraph.policies.learned.stored_kinds import FACTS_SNAPSHOT
from historygraph.signals.tokens import TokenCounter


class _Idents(list):
    """``assistant_idents`` read from a snapshot: ``(turn, frozenset of identifiers)`` per assistant
    message, each entry made from its stored ``[turn, identifiers]`` when first read (a render
    reads the last few, newest first). Appended to as a list; reading entries in any other way
    makes every entry first."""

    def __init__(self, rows: list) -> None:
        super().__init__(rows)
        self.raw = len(rows)  # entries still stored rows, all before the first made one counted from the end

    def _make(self, i: SupportsIndex) -> tuple[int, frozenset[str]]:
        v = list.__getitem__(self, i)
        if type(v) is list:
            v = (v[0], frozenset(v[1]))
            list.__setitem__(self, i, v)
        return v

    def __reversed__(self) -> Iterator[tuple[int, frozenset[str]]]:
        for i in range(len(self) - 1, -1, -1):
            yield self._make(i)

    def _all(self) -> list[tuple[int, frozenset[str]]]:
        if self.raw:
            for i in range(len(self)):
                self._make(i)
            self.raw = 0
        return list.__getitem__(self, slice(None))

    def __iter__(self) -> Iterator[tuple[int, frozenset[str]]]:
        return iter(self._all())

    @overload
    def __getitem__(self, i: SupportsIndex) -> tuple[int, frozenset[str]]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, frozenset[str]]]: ...

    def __getitem__(self, i: SupportsIndex | slice) -> tuple[int, frozenset[str]] | list[tuple[int, frozenset[str]]]:
        if isinstance(i, slice):
            return self._all()[i]
        return self._make(i)

    def __eq__(self, other: object) -> bool:
        return self._all() == (other._all() if isinstance(other, _Idents) else other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._all())

    def __contains__(self, x: object) -> bool:
        return x in self._all()


_ARRAYS = ("turn", "owner", "static", "unique_n", "superseded", "edited_later", "ident_turns_n")
_DICTS = ("value_df", "last_view", "last_edit", "last_command", "ident_first", "value_first", "unedited")
_FLATS = ("values_t", "idents_t", "words_t", "files_t")
_REUSE_ARRAYS = ("reuse_score", "reuse_turns", "reuse_last", "reuse_recent")


def _pack_facts(gf: GraphFacts) -> dict[str, Any]:
    """The state of ``gf`` as JSON-ready data (numeric arrays as base64 of their bytes), without
    the per-result facts (rebuilt on demand: ``GraphFacts.facts``) and the task (per render). The
    observed-reuse state is the one :func:`~historygraph.policies.learned.graph_state.read_reuse`
    left: read up to its ``reuse_read`` entries of the graph's TFA index
    (:attr:`~historygraph.history.reuse.ReuseIndex.touched`, appended to in message order, so the
    same prefix on a graph reopened with these messages)."""
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
        fl: Flat = getattr(gf, name)
        data[name] = fl.packed()
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


def _unpack_facts(graph: ContextGraph, counter: TokenCounter, data: _Snapshot | None) -> GraphFacts | None:
    """The :class:`GraphFacts` of a snapshot (:func:`_pack_facts`) of ``graph``'s first ``upto``
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
    gf = GraphFacts(upto=upto, encoding=data.encoding, kept=upto)
    gf.row_of = dict(zip(rows, range(len(rows))))
    gf.positions = list(rows)
    gf.unique = dict(zip(rows, data.unique))
    gf.ident_turns = dict(data.ident_turns)
    gf.assistant_idents = _Idents(data.assistant_idents)  # each entry made when first read
    for name in _DICTS:
        setattr(gf, name, getattr(data, name))
    for name in _ARRAYS + _REUSE_ARRAYS:  # reuse: as read up to entry reuse_read of the graph's TFA index
        setattr(gf, name, grow_of(_unpacked(getattr(data, name))))
    for name in _FLATS:
        vocab, rows_, ids, own, df, indexed, post_rows, post_own, indptr = getattr(data, name)
        setattr(gf, name, Flat.restored(vocab, _unpacked(rows_), _unpacked(ids), _unpacked(own), _unpacked(df), indexed,
                                        _unpacked(post_rows), _unpacked(post_own), _unpacked(indptr)))
    gf.reuse_read = data.reuse_read
    gf.reuse_seen = {p: (read, turns) for p, read, turns in data.reuse_seen}
    gf.facts.lazy, gf.facts.lazy_set = rows, set(rows)
    gf.facts.source = (msgs, graph.call_owner, graph.reuse, counter, gf.value_first, gf.ident_first)
    return gf



def new_facts(graph: ContextGraph, counter: TokenCounter) -> GraphFacts:
    """The state of a graph not seen before: from its stored snapshot when there is a valid one."""
    if graph.derived.persist and type(counter) is TokenCounter:
        gf = _unpack_facts(graph, counter, _read_snapshot(graph.derived.take_text(FACTS_SNAPSHOT, 0)))
        if gf is not None:
            return gf
    return GraphFacts(encoding=counter.encoding_name)


def keep_facts(graph: ContextGraph, gf: GraphFacts, counter: TokenCounter) -> None:
    """Put ``gf``'s snapshot for the store to write when the graph has grown by a quarter since the
    last one (read or put)."""
    n = gf.upto
    if graph.derived.persist and type(counter) is TokenCounter and snapshot_due(n, gf.kept):
        read_reuse(gf, graph)  # every row exists: the snapshot holds the reuse state up to now
        graph.derived.put_json(FACTS_SNAPSHOT, 0, msgspec.json.encode(_pack_facts(gf)).decode())
        gf.kept = n

