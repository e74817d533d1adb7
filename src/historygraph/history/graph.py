"""The persistent context graph of one session (ContextRender §3.1, docs/architecture.md).

Nodes are the session's messages in chronological order, addressed by their position (0, 1, …).
An assistant node carries its tool calls; a tool-result node answers one call by id. Each node
keeps its complete content, position, timestamp and turn. Edges:

Pins (issue 40): ``pins`` holds the positions of the messages and tool results a user marked as
never to be left out (:meth:`position_of` reads the reference they are named by); a store sets it
from what it keeps (:meth:`historygraph.store.base.Store.pin`). It is the one mutable part of a graph: the
nodes themselves never change.

* ``reuse``: from a tool result to a later assistant message that reused one of its values
  (Tool-Flow Analysis, :mod:`historygraph.history.reuse`). Edges are derived from the nodes and
  rebuilt when a stored session is reopened; the TFA values of each message, a pure function of
  it, are read from the session's derived rows when a store kept them (:data:`TFA_VALUES`,
  :mod:`historygraph.history.derived`).

Turns (ContextRender §3.3, A.3): one turn is one model invocation, i.e. one assistant message.
``turn_of[p]`` is the number of assistant messages at or before position ``p``; the invocation
being rendered has index ``t = graph.turns`` and a result's age is ``t − turn_of[r]``, so a result
answering the latest assistant message has age 0.

The graph is append-only: nothing here modifies or removes a node.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Iterator, TypeVar

import msgspec
import numpy as np

from historygraph.history.derived import Derived, DerivedKind, pack_array, snapshot_due, unpack_array
from historygraph.history.events import EventError, Message
from historygraph.history.reuse import ReuseIndex, ReuseMatch, extract_values

T = TypeVar("T")

TFA_VALUES = DerivedKind("tfa.values", ("historygraph.history.reuse", "historygraph.history.graph"))
"""Derived rows of the TFA values (ContextRender A.2) of each message: a tool result's sorted
values; an assistant message's, one sorted list per operation (:func:`operations`)."""
TFA_SCORES = DerivedKind("tfa.scores", ("historygraph.history.reuse", "historygraph.history.graph", "historygraph.history.derived"))
"""The snapshot of TFA scores ``c_t`` (ContextRender eq. 1) one :meth:`ContextGraph.reuse_scores`
call computed: one row at position 0, ``{"upto": messages then, "positions": …, "scores": …}``
(arrays by :func:`~historygraph.history.derived.pack_array`). A reopened graph takes each score from it
unless the result was touched after message ``upto`` (:meth:`ReuseIndex.seed`), so its first
render does not sum every reused result's matches again. Put when the graph has grown by a
quarter since the last one read or put (:func:`~historygraph.history.derived.snapshot_due`)."""


#: A message number or span as dropped-step markers name them: ``#16``, ``#16–#23`` (``#`` optional, ``-`` or ``–``).
MESSAGE_SPAN = re.compile(r"\s*#?(\d+)(?:\s*[–-]\s*#?(\d+))?\s*")


class GraphError(EventError):
    """An event that would corrupt the graph (duplicate call id, result for an unknown call)."""


# what a GraphError for a tool result without its call says to do
ORPHAN_HINT = ("no earlier assistant message has a tool call with that id: send the assistant message that "
               "made the call before its result, or leave the result out")


@dataclass(frozen=True, slots=True)
class Edge:
    kind: str  # "reuse"
    source: int
    target: int
    label: str


def operations(message: Message) -> list[str]:
    """TFA operations of an assistant message: its text, then each tool call's name + arguments."""
    return [message.content] + [f"{c.name} {c.arguments}" for c in message.tool_calls]


class ContextGraph:
    """Append-only graph of one session's history.

    A second result for an answered call (a framework wrote a synthetic timeout error, then the
    real result arrived) is stored too: ``result_of`` points to the latest, which is the one
    rendered; ``superseded`` maps each earlier result's position to the one that replaced it;
    ``owner_of`` maps every result's position to its call's assistant message (``call_owner`` by
    position: a reopened graph's call and result ids are distinct strings, compared in full by a
    lookup).

    ``derived`` holds the session's stored derived rows (:mod:`historygraph.history.derived`; a store
    passes them), read before ``messages`` are added; a graph built without it keeps none.

    Raises:
        GraphError: on a duplicate tool-call id, or a tool result whose call is unknown.
    """

    def __init__(self, session_id: str = "session", messages: Iterable[Message] = (), derived: Derived | None = None) -> None:
        self.session_id = session_id
        self.derived = derived if derived is not None else Derived()
        self._tfa = self.derived.table(TFA_VALUES)
        scores = self.derived.take_value(TFA_SCORES, 0)
        upto = scores.get("upto") if isinstance(scores, dict) else None
        self._scores: Any = None  # the stored TFA_SCORES, until seeded
        self._scores_upto = -1  # its "upto"
        if isinstance(upto, int) and not isinstance(upto, bool) and upto > 0:
            self._scores, self._scores_upto = scores, upto
        self._scores_mark: int | None = None  # len(reuse.touched) once the graph held _scores_upto messages
        self._scores_kept: int = max(self._scores_upto, 0)  # messages of the last snapshot read or put
        self.messages: list[Message] = []
        self.turn_of: list[int] = []
        self.turns = 0
        self.reuse = ReuseIndex()
        #: the latest assistant message's position and the TFA values of each of its operations
        #: (:func:`operations`), as given to :meth:`ReuseIndex.add_operations`
        self.latest_operations: tuple[int, list[list[str]]] | None = None
        self.call_owner: dict[str, int] = {}   # tool_call_id -> position of the assistant message
        self.result_of: dict[str, int] = {}    # tool_call_id -> position of its latest result
        self.superseded: dict[int, int] = {}   # position of an earlier result -> position of the later one
        self.owner_of: dict[int, int] = {}     # position of a tool result -> call_owner of its call
        #: positions of the pinned messages and results (see the module docstring); set by a store
        self.pins: frozenset[int] = frozenset()
        #: the store this graph is a session of (set by the store, :meth:`historygraph.store.Store.graph`;
        #: ``None`` for a graph of messages given directly): where a policy keeps per-session state that
        #: other processes sharing the store must see (:meth:`historygraph.store.Store.policy_state`)
        self.store: Any = None
        #: the prompt cache's time to live the client asks for, in seconds (Anthropic's ``"ttl": "1h"``
        #: breakpoints: 3600; set by the proxy from the request, by the replay from the recorded usage);
        #: ``None`` when unknown, where a cache-stable policy assumes its ``expiry``
        self.cache_ttl: float | None = None
        self._memos: dict[Hashable, Any] = {}
        self._memo_lock = threading.RLock()
        for m in messages:
            self.append(m)

    def memo(self, key: Hashable, factory: Callable[[], T]) -> T:
        """The per-graph state stored under ``key`` (made by ``factory()`` on first use, under this
        graph's lock), kept as long as the graph: what a policy or the renderer remembers about
        this session between renders. Reentrant (a factory may read another memo); the object's own
        updates are its owner's to guard."""
        with self._memo_lock:
            try:
                return self._memos[key]
            except KeyError:
                value = self._memos[key] = factory()
                return value

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def append(self, message: Message) -> int:
        """Add one event; returns its position."""
        pos = len(self.messages)
        if message.role == "assistant":
            for call in message.tool_calls:
                if call.id in self.call_owner:
                    raise GraphError(f"message #{pos}: tool call id {call.id!r} appears twice (first in message "
                                     f"#{self.call_owner[call.id]})")
            self.turns += 1
        elif message.role == "tool":
            cid = message.tool_call_id
            owner = self.call_owner.get(cid) if cid is not None else None
            if owner is None:
                raise GraphError(f"message #{pos}: tool result answers unknown tool_call_id {cid!r} ({ORPHAN_HINT})")
            self.owner_of[pos] = owner  # (nothing below refuses the message)
        self.messages.append(message)
        self.turn_of.append(self.turns)
        if message.role == "assistant":
            for call in message.tool_calls:
                self.call_owner[call.id] = pos
            ops = self._tfa.pop(pos, None)
            if ops is None:
                ops = [sorted(extract_values(text)) for text in operations(message)]
                self.derived.put(TFA_VALUES, pos, ops)
            self.reuse.add_operations(pos, ops)
            self.latest_operations = (pos, ops)
        elif message.role == "tool":
            assert message.tool_call_id is not None  # validate() refuses a result without a call id
            if message.tool_call_id in self.result_of:  # a late second result: the latest is rendered
                self.superseded[self.result_of[message.tool_call_id]] = pos
            self.result_of[message.tool_call_id] = pos
            values = self._tfa.pop(pos, None)
            if values is None:
                values = sorted(extract_values(message.content))
                self.derived.put(TFA_VALUES, pos, values)
            self.reuse.add_result(pos, values)
        if pos + 1 == self._scores_upto:
            self._scores_mark = len(self.reuse.touched)
        return pos

    def validate(self, batch: Iterable[Message], name: Callable[[int], str] = "event {}".format) -> None:
        """Raise :class:`GraphError` if appending ``batch`` would fail; changes nothing. The error
        names the item as ``name(i)`` (``i`` its index in ``batch``): ``event 3`` by default, or
        e.g. ``message #3``, the number a new session's graph gives it.

        Cost: O(len(batch)); the graph's own id maps are read, never copied."""
        calls: set[str] = set()      # call ids the batch adds
        for i, m in enumerate(batch):
            if m.role == "assistant":
                for c in m.tool_calls:
                    if c.id in self.call_owner or c.id in calls:
                        raise GraphError(f"{name(i)}: tool call id {c.id!r} appears twice"
                                         + (" (the session already holds it: add only messages it does not hold yet)"
                                            if c.id in self.call_owner else ""))
                    calls.add(c.id)
            elif m.role == "tool":
                cid = m.tool_call_id
                if cid not in self.call_owner and cid not in calls:
                    raise GraphError(f"{name(i)}: tool result answers unknown tool_call_id {cid!r} ({ORPHAN_HINT})")

    def extend(self, messages: Iterable[Message]) -> None:
        for m in messages:
            self.append(m)

    # -- views ---------------------------------------------------------------------------
    def results(self) -> list[int]:
        """Positions of all tool results, oldest first."""
        return [p for p, m in enumerate(self.messages) if m.role == "tool"]

    def result_by_id(self, tool_call_id: str) -> Message:
        """The stored, complete tool result for ``tool_call_id``, the latest when it has several
        (raises KeyError naming it)."""
        try:
            return self.messages[self.result_of[tool_call_id]]
        except KeyError:
            raise KeyError(f"no tool result with id {tool_call_id!r} in session {self.session_id!r}") from None

    def recall_text(self, ref: str) -> str:
        """What a placeholder or a dropped-step marker left out, by the reference it names: a tool
        call id gives that result's complete stored text (:meth:`result_by_id`); a message number
        or span (``"#16"``, ``"#16–#23"``, :data:`MESSAGE_SPAN`) gives each of those stored
        messages in full, headed by its number and role, an assistant message with its tool calls
        (name and arguments). Raises KeyError naming ``ref`` when it is neither, TypeError when it is
        not a string."""
        if not isinstance(ref, str):
            raise TypeError(f"recall: give a tool call id or a message number or span as a string ('call_7', '#16', "
                            f"'#16–#23'), got {type(ref).__name__} {ref!r}")
        if ref not in self.result_of and (m := MESSAGE_SPAN.fullmatch(ref)):
            a = int(m.group(1))
            b = int(m.group(2)) if m.group(2) else a
            if a > b:
                raise KeyError(f"messages {ref!r}: the span ends before it starts; give #A–#B with A ≤ B")
            if not b < len(self.messages):
                raise KeyError(f"messages {ref!r}: session {self.session_id!r} holds messages #0–#{len(self.messages) - 1}")
            parts = []
            for p in range(a, b + 1):
                msg = self.messages[p]
                head = f"message #{p} ({msg.role}" + (f", tool result {msg.tool_call_id}" if msg.role == "tool" else "") + ")"
                calls = "".join(f"\ntool call {c.id}: {c.name} {c.arguments}" for c in msg.tool_calls)
                parts.append(f"{head}:\n{msg.content}{calls}")
            return "\n\n".join(parts)
        return self.result_by_id(ref).content

    def position_of(self, ref: int | str) -> int:
        """The stored position of the item ``ref`` names: a tool call id (its latest result, as
        :meth:`result_by_id`), else a message number (``"#16"``, or ``"16"``) or a position (an
        ``int``). Raises KeyError naming ``ref`` when the session holds no such item."""
        if isinstance(ref, int) and not isinstance(ref, bool):
            p = ref
        elif isinstance(ref, str) and ref in self.result_of:
            return self.result_of[ref]
        elif isinstance(ref, str) and (m := re.fullmatch(r"\s*#?(\d+)\s*", ref)):
            p = int(m.group(1))
        else:
            raise KeyError(f"no item {ref!r} in session {self.session_id!r}: name a tool call id with a stored "
                           f"result, a message number such as '#3', or a position")
        if not 0 <= p < len(self.messages):
            raise KeyError(f"no item {ref!r} in session {self.session_id!r}: it holds messages #0–#{len(self.messages) - 1}")
        return p

    def item_id(self, position: int) -> str:
        """The reference of the item at ``position`` as pins are listed: a tool result's call id,
        else its message number (``"#16"``)."""
        m = self.messages[position]
        return m.tool_call_id if m.role == "tool" and m.tool_call_id else f"#{position}"

    def pinned(self) -> list[int]:
        """The pinned positions as rendered, ascending: a pinned result that a later result for the
        same call replaced (:attr:`superseded`) stands for that later one."""
        out = set()
        for p in self.pins:
            while p in self.superseded:
                p = self.superseded[p]
            out.add(p)
        return sorted(out)

    def age(self, position: int) -> int:
        """Turns since the node at ``position`` was produced, at the next invocation."""
        return self.turns - self.turn_of[position]

    def reuse_score(self, position: int) -> float:
        return self.reuse.score(position)

    def reuse_scores(self, positions: list[int]) -> list[float]:
        """:meth:`reuse_score` of each position: a reopened graph's first call takes the stored
        snapshot's scores (:data:`TFA_SCORES`); the scores of a graph from a store are put as the
        next snapshot when it is due (computed with no event appended meanwhile)."""
        if self._scores is not None:
            self._seed()
        n, version = len(self.messages), self.reuse._version
        out = list(map(self.reuse.score, positions))
        if positions and self.derived.persist and snapshot_due(n, self._scores_kept) \
                and (len(self.messages), self.reuse._version) == (n, version):
            data = {"upto": n, "positions": pack_array(np.asarray(positions, dtype=np.int64)),
                    "scores": pack_array(np.asarray(out, dtype=np.float64))}
            self.derived.put_json(TFA_SCORES, 0, msgspec.json.encode(data).decode())
            self._scores_kept = n
        return out

    def _seed(self) -> None:
        """Give the stored TFA_SCORES snapshot to the reuse index (once), when it is one of this
        graph: taken at no more messages than it holds, positions of its results, one score each."""
        data, self._scores = self._scores, None
        if self._scores_mark is None:
            return
        try:
            pos, scores = unpack_array(data["positions"]), unpack_array(data["scores"])
        except (TypeError, KeyError, ValueError):
            return
        if pos.ndim != 1 or pos.shape != scores.shape or pos.dtype.kind != "i" or scores.dtype != np.float64:
            return
        p = pos.tolist()
        if p and not (0 <= min(p) and max(p) < len(self.messages) and all(self.messages[q].role == "tool" for q in p)):
            return
        self.reuse.seed(zip(p, scores.tolist()), self._scores_mark)

    def edges(self, kind: str = "reuse") -> list[Edge]:
        if kind != "reuse":
            raise ValueError(f"unknown edge kind {kind!r}")
        return [Edge("reuse", m.source, m.user, m.value) for ms in self.reuse.matches.values() for m in ms]

    def reuse_matches(self, position: int) -> list[ReuseMatch]:
        return list(self.reuse.matches.get(position, ()))
