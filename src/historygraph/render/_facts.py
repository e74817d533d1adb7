"""Speed only: what :func:`~historygraph.render.invariants.check_invariants` reads from a graph's
stored events (:class:`StoredFacts`), kept per graph and extended by the events appended since the
last check. A reader may skip this module: the facts must equal those read from the whole history
at every check (the system and latest user positions, :func:`~historygraph.render.order.render_order`
and each position's index in it, ``counter.count_message`` of each rendered message)."""

from __future__ import annotations

import threading

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render.order import render_order
from historygraph.signals.tokens import TokenCounter

class StoredFacts:
    """What :func:`check_invariants` reads from a graph's stored events alone, kept per graph and
    extended by the events appended since the last check (graphs are append-only), so that a
    check costs O(rendered messages) instead of re-reading the whole history each time:

    * ``systems``: positions of the system messages; ``last_user``: of the latest user message;
    * ``order``/``rank``: :func:`render_order` and each position's index in it. Appending keeps
      them exact in the common case, a non-tool message or a first result of a call of the
      latest non-tool message (it goes at the end, after that message's earlier results, as
      ``render_order`` puts them); any other result (a late one, after a later message, or a
      second one for the same call) rebuilds both from :func:`render_order`;
    * ``counts``: per position, the last message rendered there (the stored event, or a stand-in
      a policy keeps and shows again, such as a placeholder) with its ``counter.count_message``,
      reused only for that very object (messages are immutable), so the recount stays a count
      of what is rendered, made here with ``counter``, not the policy's figure;
    * ``shown``: per position, the last stand-in for the stored event (a placeholder, an excerpt,
      a brief view …) that passed the §5.3 checks against it; the same object shown again is
      not checked again (the checks are a function of the two immutable messages and ``p``).

    Built by this module's own code from ``graph.messages``, ``graph.call_owner`` and
    ``graph.result_of``, never from a policy's layout state. ``lock`` serialises the checks of
    one graph (two threads may check renderings of the same session)."""

    __slots__ = ("n", "last", "systems", "last_user", "order", "rank", "tail", "answered", "counter", "counts", "shown", "lock")

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self.n = 0
        self.last: Message | None = None  # graph.messages[n - 1] when last extended
        self.systems: list[int] = []
        self.last_user: int | None = None
        self.order: list[int] = []
        self.rank: dict[int, int] = {}
        self.tail: int | None = None  # the latest non-tool position: its calls' first results may follow at the end
        self.answered: set[str] = set()  # call ids with a result so far
        self.counts: dict[int, tuple[Message, int]] = {}
        self.shown: dict[int, Message] = {}

    def extend(self, graph: ContextGraph) -> None:
        """Take in ``graph.messages[n:]`` (from scratch when the graph is not this one grown)."""
        msgs = graph.messages
        if len(msgs) < self.n or (self.n and msgs[self.n - 1] is not self.last):
            self._clear()  # not the graph seen before, grown
        rebuild, end = False, len(msgs)
        order, rank, answered, owner_of = self.order, self.rank, self.answered, graph.call_owner
        for p in range(self.n, end):
            m = msgs[p]
            role = m.role
            if role == "tool":
                cid = m.tool_call_id or ""
                if not rebuild and cid not in answered and owner_of.get(cid) == self.tail:
                    rank[p] = len(order)
                    order.append(p)
                else:
                    rebuild = True
                answered.add(cid)
                continue
            self.tail = p
            if not rebuild:
                rank[p] = len(order)
                order.append(p)
            if role == "system":
                self.systems.append(p)
            elif role == "user":
                self.last_user = p
        if rebuild:
            self.order = render_order(graph)
            self.rank = {q: i for i, q in enumerate(self.order)}
        self.n = end
        self.last = msgs[end - 1] if end else None

    def count(self, m: Message, p: int) -> int:
        """``counter.count_message(m)`` for the message rendered at position ``p``."""
        hit = self.counts.get(p)
        if hit is not None and hit[0] is m:
            return hit[1]
        n = self.counter.count_message(m)
        self.counts[p] = (m, n)
        return n


_FACTS = "render.stored_facts"  # graph.memo key, with the counter


def stored_facts(graph: ContextGraph, counter: TokenCounter) -> StoredFacts:
    """The graph's :class:`StoredFacts` for ``counter`` (made on first use, kept with the graph)."""
    return graph.memo((_FACTS, counter), lambda: StoredFacts(counter))
