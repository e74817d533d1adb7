"""The store contract: one abstract interface, implemented by every backend.

A store keeps sessions (one per agent run), each an append-only list of events (OpenAI-form
:class:`~historygraph.history.events.Message`), plus content-hash caches shared by all sessions: embeddings
and derived texts such as summaries. Derived state (reuse edges) is rebuilt from the events by
:class:`~historygraph.history.graph.ContextGraph` when a session is opened, so a store never holds
anything a policy could get out of step with. What that rebuilding and a first render would
recompute per message by pure functions of the stored messages (TFA values, step features, …)
is kept per session as versioned derived rows (:mod:`historygraph.history.derived`): read with the events
when a graph is built, written back in the session's next append transaction, by
:meth:`Store.flush` and on close; never used for a message they were not computed from.

Appends are validated against the session's graph *before* anything is written: an invalid
event (unknown call id, duplicate id, bad role) raises and leaves the stored session unchanged.

Several store instances (threads, processes, proxy replicas) may share one database. The graph
cached in-process is therefore caught up with events other instances wrote whenever it is handed
out, and an append re-reads the stored length inside the backend's write transaction
(:meth:`Store._write_transaction`), or, in a backend whose write refuses a taken position
(:attr:`Store.checks_start`), tries the cached graph first and re-reads only when the write or a
check says it is behind, so a batch is validated against, and written after, exactly what is stored.

Retries (issue 17): an append may carry an idempotency key and an expected length
(:meth:`Store.append`). A key is stored with the batch's fingerprint and positions in the same
transaction as the events, so an append whose answer was lost after the commit can be re-sent
with its key and is answered from the stored record instead of being stored twice. Each
session keeps the records of its last :data:`KEPT_KEYS` keyed appends.

Shared prefixes (issue 50): a session may be created on a *base*, ``(parent, k)``: its first
``k`` events are the parent's first ``k``, read from the parent and never copied, and only what
follows is stored in its own rows (positions ``k`` on). A branch of a conversation (a client that
edited earlier messages, aider restating its files every turn) is stored so, so a chat of n
requests that each fork the one before stores O(n) events, not O(n²). Events are append-only and
sessions are never deleted, so a parent's first ``k`` events never change and a session reads
back exactly what it would hold as a copy (:meth:`Store.messages`, :meth:`Store.graph`).

Omission records (issue 40, :mod:`historygraph.render.omissions`): what each rendering of a
session left out, an append-only stream per session beside its events. :meth:`Store.record_omitted`
only queues a record in memory (the request path pays no write); the queue is written in the
session's next append transaction (with the events: in the proxy, the upstream's answer), by
:meth:`Store.flush` and on close. :meth:`Store.omitted` reads the stored records and this
instance's queued ones, in the order they were recorded.
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from historygraph.history.derived import Derived, Row
from historygraph.history.events import EventError, Message
from historygraph.history.graph import ContextGraph
from historygraph.store.appends import KEPT_KEYS, MAX_KEY_LENGTH, AppendConflict, batch_fingerprint
from historygraph.store.full import StoreFullError, described, disk_full


_OPEN: "weakref.WeakSet[Store]" = weakref.WeakSet()  # stores not closed yet, flushed at interpreter exit


def _flush_open_stores() -> None:
    """At interpreter exit, write what every store still open has queued (omission records,
    derived rows; :meth:`Store.flush`), so a program that never closes its store loses nothing it
    recorded. A store that cannot be written is named on stderr; the others are still flushed."""
    for store in list(_OPEN):
        try:
            store.flush()
        except Exception as exc:  # noqa: BLE001  (exit: report and go on with the next store)
            print(f"historygraph: a {type(store).__name__} not closed could not write its queued records at exit: "
                  f"{exc}", file=sys.stderr)


atexit.register(_flush_open_stores)

class StoreError(KeyError):
    """Unknown or duplicate session (the message names it)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class StaleGraph(Exception):
    """Raised inside an append's write transaction (which it rolls back) when the cached graph the
    append was checked against is behind the stored session: :meth:`Store.append` then tries again
    on the graph caught up. Never leaves :meth:`Store.append`."""


@dataclass(frozen=True)
class SessionInfo:
    """One stored session at a glance: id, number of events, number of tool results, meta, and
    how many of its leading events it reads from the session it was created on (``shared``,
    :meth:`Store.create_session`'s ``base``; 0 when it stores all of them)."""

    id: str
    events: int
    tool_results: int
    meta: dict[str, Any]
    shared: int = 0


class Store(ABC):
    """Abstract store. Subclasses implement the ``_``-prefixed primitives."""

    kept_keys = KEPT_KEYS
    checks_start = False
    """Whether :meth:`_write_events` raises :class:`StaleGraph` (inside the write transaction, before
    writing anything) when the batch's start position is already stored. Such a backend's appends
    are checked against the graph as cached, without re-reading the stored length first: the write
    itself succeeds only when nothing is stored from the batch's start on, and, since positions are
    0..n−1 and the cached graph holds stored events only, exactly when the stored length is the
    cached graph's; any other outcome is decided again on the graph caught up. ``False``: the
    length is read in every append transaction (:meth:`graph`)."""
    graph_cache: int | None = None
    """Sessions whose graph this instance keeps built in memory, least recently used dropped
    first (a dropped graph is rebuilt from the stored events when next asked for); ``None`` =
    all (the library's and the evaluator's default; the proxy bounds it, ``serve --session-cache``)."""
    full: str | None = None
    """Why the last write failed for lack of disk space (:mod:`historygraph.store.full`), until a
    write succeeds again; ``None`` otherwise (the proxy's ``/health`` reports it)."""

    def __init__(self) -> None:
        _OPEN.add(self)
        self._graphs: OrderedDict[str, ContextGraph] = OrderedDict()
        self._graph_lock = threading.Lock()  # guards the two dicts; each session has its own lock
        self._session_locks: dict[str, threading.RLock] = {}
        self._omitted_queue: dict[str, list[dict[str, Any]]] = {}  # per session, records not yet written
        self._bases: dict[str, tuple[str, int] | None] = {}  # per session once read (_base)

    # -- primitives -----------------------------------------------------------------------
    @abstractmethod
    def _insert_session(self, session_id: str, meta: dict[str, Any], base: tuple[str, int] | None = None) -> bool:
        """Insert the session, with its ``base`` (``(parent, k)``, checked) when given, unless the
        id exists, atomically; whether it was inserted."""

    @abstractmethod
    def _read_base(self, session_id: str) -> tuple[str, int] | None:
        """The ``(parent, k)`` an existing session was created on, or ``None``."""

    @abstractmethod
    def _session_meta(self, session_id: str) -> dict[str, Any] | None: ...

    @abstractmethod
    def _write_events(self, session_id: str, start: int, messages: Sequence[Message]) -> None: ...

    @abstractmethod
    def _read_events_from(self, session_id: str, start: int, stop: int | None = None) -> list[Message]:
        """The session's own stored events at positions ``start`` ≤ p < ``stop`` (``None``: to the
        end), in order; a session created on a base holds none below its ``k``."""

    @abstractmethod
    def _event_count(self, session_id: str) -> int:
        """One more than the highest position among the session's own events, 0 when it has none."""

    @abstractmethod
    def _read_append_key(self, session_id: str, key: str) -> tuple[str, int, int] | None:
        """The stored ``(fingerprint, start, count)`` of a keyed append, or ``None``."""

    @abstractmethod
    def _write_append_key(self, session_id: str, key: str, fingerprint: str, start: int, count: int) -> None:
        """Record a keyed append (inside :meth:`_write_transaction`, with its events) and forget the
        session's keys beyond the newest :attr:`kept_keys`."""

    @abstractmethod
    def _read_derived(self, session_id: str) -> list[Row]:
        """The session's stored derived rows (:data:`~historygraph.history.derived.Row`), any order."""

    @abstractmethod
    def _write_derived(self, session_id: str, rows: Sequence[Row], stale: Sequence[tuple[str, str]]) -> None:
        """Store derived rows, each replacing the session's row of its kind and position, and
        delete the session's rows of each ``(kind, version)`` in ``stale`` whose version is not
        that one (inside :meth:`_write_transaction`)."""

    @abstractmethod
    def _read_pins(self, session_id: str) -> list[int]:
        """The session's pinned positions (:meth:`pin`), any order."""

    @abstractmethod
    def _write_pin(self, session_id: str, position: int, pinned: bool) -> None:
        """Pin the session's item at ``position`` (nothing when it is pinned) or, with ``pinned``
        false, unpin it (nothing when it is not)."""

    @abstractmethod
    def _read_omitted(self, session_id: str) -> list[str]:
        """The session's stored omission records (JSON texts), oldest first."""

    @abstractmethod
    def _write_omitted(self, session_id: str, records: Sequence[str]) -> None:
        """Append omission records (JSON texts) after the session's stored ones (inside
        :meth:`_write_transaction`)."""

    @abstractmethod
    def _read_policy_state(self, session_id: str, key: str) -> str | None:
        """The session's policy state stored under ``key``, or ``None``."""

    @abstractmethod
    def _write_policy_state(self, session_id: str, key: str, value: str) -> None:
        """Store ``value`` as the session's policy state under ``key``, replacing what was there."""

    @abstractmethod
    def sessions(self) -> list[str]:
        """All session ids, in creation order."""

    @abstractmethod
    def get_embeddings(self, keys: Sequence[str]) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def put_embeddings(self, items: dict[str, np.ndarray]) -> None:
        """Cache vectors by content-hash key, all or nothing: a batch that fails (a value that is
        not a float vector, a database error) stores none of its items and leaves the store usable.
        An existing entry is kept (first writer wins)."""

    @abstractmethod
    def get_text(self, kind: str, key: str) -> str | None:
        """A cached derived text (e.g. ``kind="summary"``) by content-hash key, or ``None``."""

    @abstractmethod
    def put_text(self, kind: str, key: str, value: str) -> None:
        """Cache a derived text; an existing entry is kept (first writer wins)."""

    def close(self) -> None:
        """Write what the cached graphs derived (:meth:`flush`), then release resources. A store
        still open at interpreter exit is flushed then (not closed)."""
        self.flush()
        _OPEN.discard(self)

    def flush(self, session_id: str | None = None) -> None:
        """Write the derived rows that the cached graph of ``session_id`` (``None``: of every
        session) computed since they were last written (:mod:`historygraph.history.derived`), one write
        transaction per session that has any."""
        with self._graph_lock:
            ids = [session_id] if session_id is not None else list({**self._graphs, **self._omitted_queue})
        for sid in ids:
            with self._session_lock(sid):
                with self._graph_lock:
                    g = self._graphs.get(sid)
                rows, stale = g.derived.take() if g is not None else ([], [])
                queued = self._take_omitted(sid)
                if rows or stale or queued:
                    try:
                        with self._space_checked(), self._write_transaction(sid):
                            if rows or stale:
                                self._write_derived(sid, rows, stale)
                            self._write_queued(sid, queued)
                    except BaseException:
                        self._requeue_omitted(sid, queued)
                        raise

    def record_omitted(self, session_id: str, record: dict[str, Any]) -> None:
        """Queue one omission record of ``session_id`` (:func:`~historygraph.render.omissions.
        omission_record`, a JSON-serialisable dict); written with the session's next append, by
        :meth:`flush` or on close. O(1), no I/O."""
        with self._graph_lock:
            self._omitted_queue.setdefault(session_id, []).append(record)

    def omitted(self, session_id: str) -> list[dict[str, Any]]:
        """The session's omission records, oldest first: those stored (by any instance) and then
        those this instance has queued.

        Raises:
            StoreError: unknown session.
        """
        self.session_meta(session_id)
        stored = [json.loads(r) for r in self._read_omitted(session_id)]
        with self._graph_lock:
            return stored + list(self._omitted_queue.get(session_id, ()))

    def _take_omitted(self, session_id: str) -> list[dict[str, Any]]:
        with self._graph_lock:
            return self._omitted_queue.pop(session_id, [])

    def _requeue_omitted(self, session_id: str, records: list[dict[str, Any]]) -> None:
        """Put back records whose write was rolled back, before any queued since."""
        if records:
            with self._graph_lock:
                self._omitted_queue[session_id] = records + self._omitted_queue.get(session_id, [])

    def _write_queued(self, session_id: str, records: list[dict[str, Any]]) -> None:
        if records:
            self._write_omitted(session_id, [json.dumps(r, separators=(",", ":")) for r in records])

    def sessions_with_prefix(self, prefix: str) -> list[str]:
        """Session ids starting with ``prefix``, in creation order (backends override with an
        indexed query)."""
        return [s for s in self.sessions() if s.startswith(prefix)]

    def session_infos(self) -> list[SessionInfo]:
        """Every session with its event and tool-result counts, in creation order, without
        building any graph (database backends override with one aggregate query)."""
        out = []
        for sid in self.sessions():
            events = self._session_events(sid)
            base = self._base(sid)
            out.append(SessionInfo(sid, len(events), sum(m.role == "tool" for m in events), self.session_meta(sid),
                                   base[1] if base else 0))
        return out

    def _with_bases(self, own: list[tuple[str, int, int, dict[str, Any], str | None, int | None]]) -> list[SessionInfo]:
        """:class:`SessionInfo` from each session's counts of its own events and tool results and
        its base (parent, k, or ``None``s), the shared prefix's counted in: a backend's
        :meth:`session_infos` from one aggregate query."""
        out = []
        for sid, n, tools, meta, parent, k in own:
            if parent is not None and k is not None:
                n += k
                tools += sum(m.role == "tool" for m in self._session_events(parent, 0, k))
            out.append(SessionInfo(sid, n, tools, meta, k or 0))
        return out

    def _base(self, session_id: str) -> tuple[str, int] | None:
        """The ``(parent, k)`` an existing session was created on (:meth:`create_session`), or
        ``None``; kept once read (a base never changes)."""
        with self._graph_lock:
            if session_id in self._bases:
                return self._bases[session_id]
        base = self._read_base(session_id)
        with self._graph_lock:
            self._bases[session_id] = base
        return base

    def _session_events(self, session_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """The session's events at positions ``start`` ≤ p < ``stop`` (``None``: to the end), its
        base's shared prefix included: from the parent's graph when this instance holds it built
        (the same objects, no I/O), else read from the parent's rows, and so on up its bases."""
        base = self._base(session_id)
        if base is None:
            return self._read_events_from(session_id, start, stop)
        parent, k = base
        out: list[Message] = []
        if start < k:
            end = k if stop is None else min(stop, k)
            with self._graph_lock:
                g = self._graphs.get(parent)
            out = g.messages[start:end] if g is not None and len(g) >= end else self._session_events(parent, start, end)
        if stop is None or stop > k:
            out += self._read_events_from(session_id, max(start, k), stop)
        return out

    def _length(self, session_id: str) -> int:
        """Number of events of an existing session, its base's shared prefix included."""
        base = self._base(session_id)
        return max(self._event_count(session_id), base[1] if base else 0)

    def _session_lock(self, session_id: str) -> threading.RLock:
        """The in-process lock of one session's cached graph (appends to other sessions proceed)."""
        with self._graph_lock:
            return self._session_locks.setdefault(session_id, threading.RLock())

    @contextmanager
    def _write_transaction(self, session_id: str) -> Iterator[None]:
        """Hold the backend's write lock for ``session_id`` while an append reads the stored
        length and writes; commits on success, rolls back on an exception. Default: no-op (a
        backend only one instance can use)."""
        yield

    @contextmanager
    def _space_checked(self) -> Iterator[None]:
        """Around a write (already rolled back when it raises): a full disk becomes
        :class:`StoreFullError` and is kept in :attr:`full`; a write that succeeds clears it."""
        try:
            yield
        except Exception as exc:
            if not disk_full(exc):
                raise
            self.full = described(exc)  # shown by /health: no file name
            raise StoreFullError(str(getattr(self, "path", type(self).__name__)), exc) from exc
        self.full = None

    # -- contract -------------------------------------------------------------------------
    def create_session(self, session_id: str, meta: dict[str, Any] | None = None, *,
                       base: tuple[str, int] | None = None) -> None:
        """Create a session, atomically: of several callers creating the same id at once
        (threads, or processes sharing the database), exactly one succeeds. It is empty, or, with
        ``base=(parent, k)``, holds the first ``k`` events of the stored session ``parent``,
        shared with it rather than copied (module docstring, "Shared prefixes"); what is appended
        goes after them (positions ``k`` on).

        Raises:
            StoreError: the id exists (also when another caller created it a moment ago), or is
                empty; ``parent`` is not a stored session.
            ValueError: ``k`` is not an integer from 0 to the parent's number of events.
            StoreFullError: the store's disk is full (:mod:`historygraph.store.full`).
        """
        if not session_id:
            raise StoreError("session id must be a non-empty string")
        if base is not None:
            parent, k = base
            self.session_meta(parent)
            n = self._length(parent)
            if not (isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= n):
                raise ValueError(f"base: session {parent!r} holds {n} events, so k must be an integer from 0 to {n}, got {k!r}")
        with self._space_checked():
            inserted = self._insert_session(session_id, dict(meta or {}), base)
        if not inserted:
            raise StoreError(f"session {session_id!r} already exists")

    def has_session(self, session_id: str) -> bool:
        return self._session_meta(session_id) is not None

    def session_meta(self, session_id: str) -> dict[str, Any]:
        meta = self._session_meta(session_id)
        if meta is None:
            raise StoreError(f"no session {session_id!r} in this store")
        return meta

    def graph(self, session_id: str) -> ContextGraph:
        """The session's context graph (rebuilt from stored events on first access)."""
        with self._session_lock(session_id):
            with self._graph_lock:
                g = self._graphs.get(session_id)
                if g is not None:
                    self._graphs.move_to_end(session_id)
            if g is None:
                self.session_meta(session_id)
                derived = Derived(self._read_derived(session_id), persist=True)
                g = ContextGraph(session_id, self._session_events(session_id), derived=derived)
                g.store = self
                with self._graph_lock:
                    self._graphs[session_id] = g
                    while self.graph_cache is not None and len(self._graphs) > max(1, self.graph_cache):
                        self._graphs.popitem(last=False)
            elif self._event_count(session_id) > len(g):  # another instance appended
                g.extend(self._session_events(session_id, len(g)))
            g.pins = frozenset(self._read_pins(session_id))  # (another instance may have pinned since)
            return g

    def pin(self, session_id: str, ref: int | str, pinned: bool = True) -> int:
        """Pin the item ``ref`` names (:meth:`ContextGraph.position_of`: a position, ``"#16"`` or a
        tool call id) so that every rendering shows it whole (docs/architecture.md, "Pins"); with
        ``pinned`` false, unpin it. Kept in the store beside the events (which stay as appended)
        and set on the session's graph; pinning twice, or unpinning what is not pinned, changes
        nothing. Returns the position.

        Raises:
            StoreError: unknown session.
            KeyError: the session holds no such item (nothing is stored).
        """
        with self._session_lock(session_id):
            g = self.graph(session_id)
            p = g.position_of(ref)
            with self._write_transaction(session_id):
                self._write_pin(session_id, p, pinned)
            g.pins = g.pins | {p} if pinned else g.pins - {p}
            return p

    def policy_state(self, session_id: str, key: str) -> str | None:
        """What a policy keeps between renders of a stored session under ``key`` (a text, JSON by
        convention), as last written by :meth:`put_policy_state` from this or any other instance
        sharing the store; ``None`` when nothing was written. Cache-stable rendering keeps its
        previous rendering here (:mod:`historygraph.policies.stable_state`), so that proxy instances
        serving one session in turn extend one rendering."""
        return self._read_policy_state(session_id, key)

    def put_policy_state(self, session_id: str, key: str, value: str) -> None:
        """Replace the session's policy state under ``key`` with ``value`` (last writer wins).
        Raises StoreError for an unknown session (nothing is written)."""
        self.session_meta(session_id)
        with self._space_checked():
            self._write_policy_state(session_id, key, value)

    def pins(self, session_id: str) -> list[int]:
        """The session's pinned positions, ascending (raises StoreError for an unknown session)."""
        self.session_meta(session_id)
        return sorted(self._read_pins(session_id))

    def messages(self, session_id: str) -> list[Message]:
        """The stored events, exactly as appended (those shared with a base included)."""
        self.session_meta(session_id)
        return self._session_events(session_id)

    def append(self, session_id: str, messages: Sequence[Message] | Message, *, idempotency_key: str | None = None,
               expected_length: int | None = None) -> list[int]:
        """Validate and append events; returns their positions.

        Args:
            idempotency_key: when given, a later append to this session with the same key and the
                same batch and ``expected_length`` (:func:`batch_fingerprint`) returns the positions
                of the first and writes nothing; the key is committed with the events, in one
                transaction. Only appends that stored their batch are remembered (the last
                :data:`KEPT_KEYS` per session). 1 to :data:`MAX_KEY_LENGTH` characters.
            expected_length: append only if the session holds exactly this many events (checked
                inside the write transaction, after the key).

        Raises:
            StoreError: unknown session.
            AppendConflict: the key was used for another batch, or the length is not
                ``expected_length``; nothing is written.
            ValueError: a key that is empty or too long, a negative ``expected_length``.
            EventError/GraphError: an event is invalid; nothing of the batch is written.
            StoreFullError: the store's disk is full; nothing of the batch is written
                (:mod:`historygraph.store.full`).
        """
        batch = [messages] if isinstance(messages, Message) else list(messages)
        for i, m in enumerate(batch):
            if not isinstance(m, Message):
                raise TypeError(f"append: item {i} is {type(m).__name__}, expected Message")
        if idempotency_key is not None and not (isinstance(idempotency_key, str) and 0 < len(idempotency_key) <= MAX_KEY_LENGTH):
            raise ValueError(f"idempotency key must be a string of 1 to {MAX_KEY_LENGTH} characters, got {idempotency_key!r:.80}")
        if expected_length is not None and not (isinstance(expected_length, int) and not isinstance(expected_length, bool) and expected_length >= 0):
            raise ValueError(f"expected_length must be a non-negative integer, got {expected_length!r}")
        fingerprint = batch_fingerprint(batch, expected_length) if idempotency_key is not None else ""
        with self._session_lock(session_id):
            fresh = not self.checks_start
            queued = self._take_omitted(session_id)  # written in this transaction, put back if it fails
            while True:
                try:
                    with self._space_checked(), self._write_transaction(session_id):
                        g, answered = self._append_in_transaction(session_id, batch, idempotency_key, fingerprint,
                                                                  expected_length, fresh)
                        self._write_queued(session_id, queued)
                except StaleGraph as exc:  # rolled back; again on the graph caught up with what is stored
                    if fresh:  # the start of a caught-up graph taken: the stored positions are not 0..n−1
                        self._requeue_omitted(session_id, queued)
                        raise (exc.__cause__ or exc) from None
                    fresh = True
                    continue
                except BaseException:
                    self._requeue_omitted(session_id, queued)
                    raise
                if answered is not None:
                    return answered
                return [g.append(m) for m in batch]  # committed

    def _append_in_transaction(self, session_id: str, batch: list[Message], idempotency_key: str | None,
                               fingerprint: str, expected_length: int | None,
                               fresh: bool) -> tuple[ContextGraph, list[int] | None]:
        """:meth:`append` inside its write transaction: the session's graph (the batch is appended
        to it once committed), and the positions when a keyed retry is answered without writing. ``fresh``: catch the cached graph up with
        the stored events first (one length query); else use it as cached and raise
        :class:`StaleGraph` before any answer other than writing the batch, and from
        :meth:`_write_events` when the batch's start is taken (:attr:`checks_start`)."""
        with self._graph_lock:
            g = None if fresh else self._graphs.get(session_id)
        if g is None:
            g, fresh = self.graph(session_id), True  # caught up inside the transaction
        if idempotency_key is not None:
            found = self._read_append_key(session_id, idempotency_key)
            if found is not None:
                if found[0] != fingerprint:
                    if not fresh:
                        raise StaleGraph(session_id)  # the conflict names the stored length
                    raise AppendConflict(f"idempotency key {idempotency_key!r} was already used in session "
                                         f"{session_id!r} for a different batch", idempotency_key, len(g))
                return g, list(range(found[1], found[1] + found[2]))  # the first answer; nothing written
        if expected_length is not None and len(g) != expected_length:
            if not fresh:
                raise StaleGraph(session_id)
            raise AppendConflict(f"expected_length: session {session_id!r} has {len(g)} events, "
                                 f"not {expected_length}", None, len(g))
        try:
            g.validate(batch, f"session {session_id!r}, event {{}} of the batch".format)  # the whole batch, before anything is written
        except EventError:
            if not fresh:  # e.g. a tool result whose call another instance stored
                raise StaleGraph(session_id) from None
            raise
        start = len(g)
        self._write_events(session_id, start, batch)
        if idempotency_key is not None:
            self._write_append_key(session_id, idempotency_key, fingerprint, start, len(batch))
        rows, stale = g.derived.take()  # what renders derived since the last write, with the events
        if rows or stale:
            self._write_derived(session_id, rows, stale)
        return g, None
