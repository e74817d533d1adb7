"""Speed only: the per-graph token memo (:class:`TokenMemo`: every message's token count, every
tool result's placeholder and its count, the layout skeleton) and the per-graph brief-view
savings (:func:`brief_savings`), kept across renders and as derived rows of a stored session
(:mod:`historygraph.history.derived`). A reader may skip this module: what it keeps must equal
``counter.count_message`` of each stored message and of its placeholder
(:func:`~historygraph.render.markers.placeholder_for` or the policy's builder), and per message
what :func:`~historygraph.render.markers.brief_view` saves, computed afresh for every render.
ReCAP reads its counts too (:func:`token_memo`)."""

from __future__ import annotations

import threading
from functools import cache
from typing import Any, Callable

import msgspec
import numpy as np

from historygraph.history.derived import DerivedKind, pack_array, snapshot_due, unpack_array
from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render._grow import Grow
from historygraph.render._skeleton import Skeleton
from historygraph.render.markers import brief_view, marker_plan
from historygraph.signals.tokens import TokenCounter


class _Placeholders(dict[int, Message]):
    """The placeholder of each tool result of one graph by position, built on first use (a render
    shows only a few of them; a reopened session's counts come from its derived rows without
    building any). Only ever added to, so snapshots share it uncopied."""

    def __init__(self, counter: TokenCounter, build: Callable[[Message, TokenCounter], Message]) -> None:
        super().__init__()
        self.counter, self.build = counter, build
        self.messages: list[Message] = []

    def __missing__(self, p: int) -> Message:
        m = self.messages[p] if 0 <= p < len(self.messages) else None
        if m is None or m.role != "tool":
            raise KeyError(p)
        return self.setdefault(p, self.build(m, self.counter))

    def get(self, p: int, default: Any = None) -> Any:
        try:
            return self[p]
        except KeyError:
            return default


@cache
def token_rows(stock: bool, encoding: str, build: Callable[[Message, TokenCounter], Message]) -> DerivedKind | None:
    """The derived rows (:mod:`historygraph.history.derived`) of :class:`TokenMemo`'s per-message counts:
    one per position, ``count_message`` of the message, and for a tool result ``[its count, its
    placeholder's count]``. Named for the encoding and the placeholder builder, so another
    encoding or builder never reads them; versioned by the source of the modules that compute
    them. ``stock``: the counter is a plain :class:`TokenCounter`. ``None`` (nothing kept) for
    another counter (a subclass may count differently) or a
    builder that is not a module-level function (a closure's output is not a function of the
    message alone)."""
    name = getattr(build, "__qualname__", "<none>")
    module = getattr(build, "__module__", None)
    if not stock or "<" in name or not isinstance(module, str):
        return None
    return DerivedKind(f"render.tokens:{encoding}:{module}.{name}",
                       tuple(dict.fromkeys(("historygraph.render._memo", "historygraph.history.events", "historygraph.signals.tokens",
                                            "tiktoken.core", module))))


@cache
def token_snapshot(rows: DerivedKind) -> DerivedKind:
    """The per-graph snapshot of :class:`TokenMemo` beside its per-message rows ``rows``
    (:func:`token_rows`): one row at position 0 holding, at a known number of messages ``upto``,
    every message's count and every tool result's position, count and placeholder count as
    arrays (:func:`~historygraph.history.derived.pack_array`), so that a reopened session reads one row
    instead of decoding one per message. Put when the graph has grown by a quarter since the last
    one read or put (:func:`~historygraph.history.derived.snapshot_due`); versioned as ``rows`` and by
    the packing (``historygraph.history.derived``)."""
    return DerivedKind(rows.name.replace("render.tokens:", "render.memo:", 1), rows.modules + ("historygraph.history.derived",))


def _tool_positions(graph: ContextGraph) -> np.ndarray:
    """Positions of every tool result of ``graph``, ascending (int64): the latest result of each
    call and every superseded one, the keys of ``owner_of`` (no pass over the messages)."""
    a = np.fromiter(graph.owner_of, dtype=np.int64, count=len(graph.owner_of))
    a.sort()  # (filled in position order: already sorted)
    return a


class TokenMemo:
    """What :class:`Layout` needs per message of one graph, computed once and kept across renders
    (the graph is append-only, so position ``p`` always holds the same message): the token count
    of every message, and for every tool result its placeholder (built when first asked for) and
    the placeholder's count. One memo per graph, counter type + encoding and placeholder builder;
    filled up to the graph's length on each use, under a lock (the proxy renders in worker
    threads). The counts of a graph from a store are read from and kept as its derived rows
    (:func:`token_rows`)."""

    def __init__(self, counter: TokenCounter, placeholder: Callable[[Message, TokenCounter], Message]) -> None:
        self.counter, self.build = counter, placeholder
        self.tokens: list[int] = []                              # count_message(messages[p])
        # per result its placeholder, only ever added to, so layouts share it uncopied
        self.ph_message = _Placeholders(counter, placeholder)
        self.tools = Grow()                                     # positions of the tool results, ascending
        self.tools_ph = Grow()                                  # the placeholder's count of each of them, in that order
        # result_tokens and ph_tokens as dicts, built when first read
        self._result_tokens: dict[int, int] | None = None
        self._ph_tokens: dict[int, int] | None = None
        self.marker_plan = marker_plan(counter)
        self.kind = token_rows(type(counter) is TokenCounter, counter.encoding_name, placeholder)
        self._skeleton = Skeleton()
        self._lock = threading.Lock()
        # (graph length, loop_guard of the graph at that length): the graph is append-only
        self.guard: tuple[int, tuple[int, ...]] | None = None
        self.kept = 0  # messages of the last snapshot read or put (token_snapshot)
        self.one_by_one = False  # started from a snapshot: read the later rows one at a time
        self._tokens_array = np.zeros(0, dtype=np.int64)  # tokens_array()
        # Layout._remove_deltas of runs of dropped steps, by (skeleton build, first, last unit), kept
        # across renders: a run's marker costs depend only on its units' facts, which no longer change
        # once a later unit exists (a change to an earlier unit rebuilds the skeleton: a new build)
        self.run_deltas: dict[tuple[int, int, int], np.ndarray] = {}

    def skeleton(self, graph: ContextGraph, budget: int | None = None) -> dict[str, Any]:
        """A snapshot of the graph's :class:`Skeleton`, taken under the lock (another thread may
        extend it meanwhile): copies of its lists a layout iterates or changes; its dicts, sets and
        per-unit facts themselves (:meth:`Skeleton.lend`: what is lent is only ever added to, so
        a snapshot reads what it read when taken). ``over``: the candidates whose full cost exceeds
        ``budget``, ascending."""
        with self._lock:
            sk = self._skeleton
            sk.update(graph, self)
            over = sk.over(budget, self.tokens_array()) if budget is not None else []
            sk.lend()
            return {"users": sk.users, "current_user": sk.current_user, "first_user": sk.first_user, "last_assistant": sk.last_assistant,
                    "outside": sk.outside, "order": list(sk.order), "units": sk.units.view(),
                    "build": sk.builds, "synthetic": sk.synthetic,
                    "placeholder": self.ph_message, "candidates": list(sk.candidates),
                    "over": over, "glue": list(sk.glue), "breaks": sk.breaks, "facts": (sk.lo, sk.hi, sk.top, sk.ncalls, sk.pre),
                    "full_tokens": sk.full_tokens, "total_cost": sk.total_cost,
                    "starts": list(sk.starts),
                    "arrays": sk.arrays()}

    def render_order(self, graph: ContextGraph) -> list[int]:
        """The graph's render order (:func:`~historygraph.render.order.render_order`) from its
        skeleton, updated under the lock; a new list."""
        with self._lock:
            self._skeleton.update(graph, self)
            return list(self._skeleton.order)

    def candidate_maps(self, build: int) -> tuple[dict[int, int], dict[int, Message], dict[int, int]] | None:
        """The skeleton's candidate dicts (:meth:`Skeleton.maps`, built now if they were not),
        lent as a snapshot's are, when the skeleton is still of build ``build`` (a later state of
        it only added candidates, with the same values); None when it was rebuilt since."""
        with self._lock:
            sk = self._skeleton
            if sk.builds != build:
                return None
            maps = sk.maps()
            sk.lend()
            return maps

    @property
    def result_tokens(self) -> dict[int, int]:
        """Every tool result's count by position (its entry of :attr:`tokens`), a dict built when
        first read, then kept and only ever added to (layouts share it uncopied)."""
        with self._lock:
            if self._result_tokens is None:
                t = self.tools.view()
                self._result_tokens = dict(zip(t.tolist(), self.tokens_array()[t].tolist()))
            return self._result_tokens

    @property
    def ph_tokens(self) -> dict[int, int]:
        """Every tool result's placeholder count by position (:attr:`tools_ph`), a dict built when
        first read, then kept as :attr:`result_tokens`."""
        with self._lock:
            if self._ph_tokens is None:
                self._ph_tokens = dict(zip(self.tools.view().tolist(), self.tools_ph.view().tolist()))
            return self._ph_tokens

    def ph_count(self, p: int) -> int:
        """The placeholder count of tool result ``p`` (from the arrays: callable under the lock)."""
        return int(self.tools_ph.view()[int(self.tools.view().searchsorted(p))])

    def tokens_array(self) -> np.ndarray:
        """:attr:`tokens` as an int64 array (kept, extended when the memo has grown)."""
        a = self._tokens_array
        if len(a) != len(self.tokens):
            a = self._tokens_array = np.concatenate([a[:len(self.tokens)], np.asarray(self.tokens[len(a):], dtype=np.int64)]) \
                if len(a) < len(self.tokens) else np.asarray(self.tokens, dtype=np.int64)
        return a

    def _restore(self, graph: ContextGraph, data: Any) -> bool:
        """Start from the stored snapshot ``data`` (:func:`token_snapshot`) when it is one of this
        graph: taken at no more messages than it holds, with exactly the graph's tool results
        among them, one count per message and two per result (the first the message's count)."""
        try:
            upto = data["upto"]
            tools, tokens, rtok, ptok = (unpack_array(data[k]) for k in ("tools", "tokens", "result", "placeholder"))
        except (TypeError, KeyError, ValueError):
            return False
        if type(upto) is not int or not 0 < upto <= len(graph.messages) or tokens.shape != (upto,) \
                or not (tools.ndim == rtok.ndim == ptok.ndim == 1) or not (len(tools) == len(rtok) == len(ptok)) \
                or tokens.dtype.kind != "i" or tools.dtype.kind != "i" or rtok.dtype.kind != "i" or ptok.dtype.kind != "i":
            return False
        have = _tool_positions(graph)
        have = have[:int(np.searchsorted(have, upto))]
        if not np.array_equal(have, tools) or not np.array_equal(tokens[tools], rtok):
            return False
        self.tokens = tokens.tolist()
        self._tokens_array = tokens.astype(np.int64)
        self.tools = Grow(tools.astype(np.int64))
        self.tools_ph = Grow(ptok.astype(np.int64))
        self._result_tokens = self._ph_tokens = None  # (built again when read)
        self.kept = upto
        return True

    def _keep(self, graph: ContextGraph) -> None:
        """Put the snapshot (:func:`token_snapshot`) when the graph has grown by a quarter since the last one."""
        n = len(self.tokens)
        if self.kind is None or not graph.derived.persist or not snapshot_due(n, self.kept):
            return
        tools, tokens = self.tools.view(), self.tokens_array()
        data = {"upto": n, "tools": pack_array(tools), "tokens": pack_array(tokens),
                "result": pack_array(tokens[tools]), "placeholder": pack_array(self.tools_ph.view())}
        graph.derived.put_json(token_snapshot(self.kind), 0, msgspec.json.encode(data).decode())
        self.kept = n

    def update(self, graph: ContextGraph) -> None:
        messages = graph.messages
        if len(self.tokens) == len(messages):
            return
        with self._lock:
            self.ph_message.messages = messages
            derived = graph.derived
            kind = self.kind if derived.persist else None
            stored: dict[int, Any] = {}
            if kind is not None:
                if not self.tokens and self._restore(graph, derived.take_value(token_snapshot(kind), 0)):
                    self.one_by_one = True
                # after a snapshot, the rows of the messages added since, one by one (not the whole table decoded)
                stored = _RowsAfter(derived, kind) if self.one_by_one else derived.table(kind)
            count, build = self.counter.count_message, self.build
            tokens, result_tokens, ph_tokens = self.tokens, self._result_tokens, self._ph_tokens
            tools: list[int] = []
            tools_ph: list[int] = []
            pop = stored.pop
            try:
                for p in range(len(tokens), len(messages)):
                    m = messages[p]
                    v = pop(p, None)
                    if m.role == "tool":
                        if type(v) is list and len(v) == 2:
                            n, k = v
                        else:
                            n = count(m)
                            ph = self.ph_message[p] = build(m, self.counter)
                            k = count(ph)
                            if kind is not None:
                                derived.put(kind, p, [n, k])
                        if result_tokens is not None:
                            result_tokens[p] = n
                        if ph_tokens is not None:
                            ph_tokens[p] = k
                        tools.append(p)
                        tools_ph.append(k)
                    elif type(v) is int:
                        n = v
                    else:
                        n = count(m)
                        if kind is not None:
                            derived.put(kind, p, n)
                    tokens.append(n)
            finally:  # (what was counted, even when counting a later message failed)
                self.tools.extend(tools)
                self.tools_ph.extend(tools_ph)
            self._keep(graph)


class _RowsAfter(dict):
    """``pop(position, default)`` of a kind's stored rows read one at a time
    (:meth:`~historygraph.history.derived.Derived.take_value`): after a snapshot, only the rows of the
    messages added since are read, not the whole table decoded."""

    def __init__(self, derived: Any, kind: DerivedKind) -> None:
        super().__init__()
        self.derived, self.kind = derived, kind

    def pop(self, position: int, default: Any = None) -> Any:
        v = self.derived.take_value(self.kind, position)
        return default if v is None else v


_TOKEN_MEMOS = "render.token_memo"  # graph.memo key, with the counter's type and encoding and the placeholder builder


def token_memo(graph: ContextGraph, counter: TokenCounter,
                placeholder: Callable[[Message, TokenCounter], Message]) -> TokenMemo:
    """The graph's :class:`TokenMemo` for the counter's type and encoding and the placeholder
    builder ``placeholder`` (made on first use, shared by every layout of the graph), filled up to
    the graph's length."""
    memo = graph.memo((_TOKEN_MEMOS, type(counter), counter.encoding_name, placeholder),
                      lambda: TokenMemo(counter, placeholder))
    memo.update(graph)
    return memo


_SAVINGS = "render.brief_savings"  # graph.memo key: {encoding: Grow of the savings by position}


@cache
def brief_rows(stock: bool, encoding: str) -> DerivedKind | None:
    """The derived rows (:mod:`historygraph.history.derived`) of :func:`brief_savings`: at the position of
    each message with a brief view, the tokens it saves. Named for the encoding, versioned as
    :func:`token_rows`; ``None`` (nothing kept) for a counter other than a plain
    :class:`TokenCounter` (``stock`` false)."""
    if not stock:
        return None
    return DerivedKind(f"render.brief:{encoding}", ("historygraph.render._memo", "historygraph.render.markers",
                                                    "historygraph.history.events", "historygraph.signals.tokens",
                                                    "tiktoken.core"))


def brief_savings(graph: ContextGraph, counter: TokenCounter) -> np.ndarray:
    """Tokens the brief view of each stored message saves (:meth:`Layout.brief`; 0 where there is
    no brief view or it saves nothing), per position, int64: kept per graph and extended as it
    grows, so the revival costs of every dropped step are one array operation. A graph from a
    store reads and keeps them as derived rows (:func:`brief_rows`); the brief messages
    themselves are built only for the units a render revives."""
    per: dict[str, Grow] = graph.memo(_SAVINGS, dict)
    enc = counter.encoding_name
    saved = per.setdefault(enc, Grow())
    msgs = graph.messages
    if saved.n > len(msgs):
        saved = per[enc] = Grow()
    if saved.n == len(msgs):
        return saved.view()
    derived = graph.derived
    kind = brief_rows(type(counter) is TokenCounter, enc) if derived.persist else None
    kept = savings_kept(graph)
    stored: dict[int, Any] = {}
    if kind is not None:
        snap = brief_snapshot(kind)
        if saved.n == 0:
            a = _restore_savings(graph, derived.take_value(snap, 0))
            if a is not None:
                saved = per[enc] = Grow(a)
                kept[enc] = (len(a), True)
        # after a snapshot, the rows of the messages added since, one by one (not the whole table decoded)
        stored = _RowsAfter(derived, kind) if kept.get(enc, (0, False))[1] else derived.table(kind)
    new: list[int] = []
    for pos in range(saved.n, len(msgs)):
        v = stored.pop(pos, None)
        if type(v) is int:
            new.append(v)
            continue
        view = brief_view(graph, counter, pos)
        new.append(max(0, view[0]) if view is not None else 0)
        if view is not None and kind is not None:
            derived.put(kind, pos, new[-1])
    saved.extend(new)
    if kind is not None and snapshot_due(saved.n, kept.get(enc, (0, False))[0]):
        data = {"upto": saved.n, "saved": pack_array(saved.view())}
        derived.put_json(brief_snapshot(kind), 0, msgspec.json.encode(data).decode())
        kept[enc] = (saved.n, kept.get(enc, (0, False))[1])
    return saved.view()


_SAVINGS_KEPT = "render.brief_savings_kept"  # graph.memo key of savings_kept


def savings_kept(graph: ContextGraph) -> dict[str, tuple[int, bool]]:
    """Per encoding: (messages of the last brief-savings snapshot read or put, whether the
    savings started from one); kept per graph."""
    return graph.memo(_SAVINGS_KEPT, dict)


@cache
def brief_snapshot(rows: DerivedKind) -> DerivedKind:
    """The per-graph snapshot of :func:`brief_savings` beside its per-message rows ``rows``
    (:func:`brief_rows`): one row at position 0, ``{"upto", "saved"}``, the savings of the first
    ``upto`` messages as one packed array (:func:`~historygraph.history.derived.pack_array`), put when the
    graph has grown by a quarter since the last one (:func:`~historygraph.history.derived.snapshot_due`)."""
    return DerivedKind(rows.name.replace("render.brief:", "render.briefs:", 1), rows.modules + ("historygraph.history.derived",))


def _restore_savings(graph: ContextGraph, data: Any) -> np.ndarray | None:
    """The savings of a stored snapshot (:func:`brief_snapshot`) when it is one of this graph: of
    no more messages than it holds, whole numbers, not below 0, and none but at an assistant
    message (only those have a brief view)."""
    try:
        upto, a = data["upto"], unpack_array(data["saved"])
    except (TypeError, KeyError, ValueError):
        return None
    if type(upto) is not int or not 0 < upto <= len(graph.messages) or a.shape != (upto,) or a.dtype.kind != "i" \
            or (len(a) and int(a.min()) < 0):
        return None
    turn = np.fromiter(graph.turn_of, dtype=np.int64, count=upto)
    assistant = np.diff(turn, prepend=0) > 0
    if a[~assistant].any():
        return None
    return a.astype(np.int64)
