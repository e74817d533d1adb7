"""The store contract: one abstract interface, implemented by every backend.

A store keeps sessions (one per agent run), each an append-only list of events (OpenAI-form
:class:`~historygraph.events.Message`), plus content-hash caches shared by all sessions: embeddings
and derived texts such as summaries. Derived state (reuse edges) is rebuilt from the events by
:class:`~historygraph.graph.ContextGraph` when a session is opened, so a store never holds
anything a policy could get out of step with.

Appends are validated against the session's graph *before* anything is written: an invalid
event (unknown call id, duplicate id, bad role) raises and leaves the stored session unchanged.

Several store instances (threads, processes, proxy replicas) may share one database. The graph
cached in-process is therefore caught up with events other instances wrote whenever it is handed
out, and an append re-reads the stored length inside the backend's write transaction
(:meth:`Store._write_transaction`), so a batch is validated against, and written after, exactly
what is stored.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..events import Message
from ..graph import ContextGraph


class StoreError(KeyError):
    """Unknown or duplicate session (the message names it)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class SessionInfo:
    """One stored session at a glance: id, number of events, number of tool results, meta."""

    id: str
    events: int
    tool_results: int
    meta: dict[str, Any]


class Store(ABC):
    """Abstract store. Subclasses implement the ``_``-prefixed primitives."""

    def __init__(self) -> None:
        self._graphs: dict[str, ContextGraph] = {}
        self._graph_lock = threading.Lock()  # guards the two dicts; each session has its own lock
        self._session_locks: dict[str, threading.RLock] = {}

    # -- primitives -----------------------------------------------------------------------
    @abstractmethod
    def _insert_session(self, session_id: str, meta: dict[str, Any]) -> None: ...

    @abstractmethod
    def _session_meta(self, session_id: str) -> dict[str, Any] | None: ...

    @abstractmethod
    def _write_events(self, session_id: str, start: int, messages: Sequence[Message]) -> None: ...

    @abstractmethod
    def _read_events(self, session_id: str) -> list[Message]: ...

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
        """Release resources (no-op for the memory store)."""

    def sessions_with_prefix(self, prefix: str) -> list[str]:
        """Session ids starting with ``prefix``, in creation order (backends override with an
        indexed query)."""
        return [s for s in self.sessions() if s.startswith(prefix)]

    def session_infos(self) -> list[SessionInfo]:
        """Every session with its event and tool-result counts, in creation order, without
        building any graph (database backends override with one aggregate query)."""
        out = []
        for sid in self.sessions():
            events = self._read_events(sid)
            out.append(SessionInfo(sid, len(events), sum(m.role == "tool" for m in events), self.session_meta(sid)))
        return out

    def _session_lock(self, session_id: str) -> threading.RLock:
        """The in-process lock of one session's cached graph (appends to other sessions proceed)."""
        with self._graph_lock:
            return self._session_locks.setdefault(session_id, threading.RLock())

    def _event_count(self, session_id: str) -> int:
        """Number of stored events (backends override with a cheap query)."""
        return len(self._read_events(session_id))

    def _read_events_from(self, session_id: str, start: int) -> list[Message]:
        """Stored events from position ``start`` on (backends override with a ranged query)."""
        return self._read_events(session_id)[start:]

    @contextmanager
    def _write_transaction(self, session_id: str) -> Iterator[None]:
        """Hold the backend's write lock for ``session_id`` while an append reads the stored
        length and writes; commits on success, rolls back on an exception. Default: no-op (a
        backend only one instance can use)."""
        yield

    # -- contract -------------------------------------------------------------------------
    def create_session(self, session_id: str, meta: dict[str, Any] | None = None) -> None:
        """Create an empty session. Raises :class:`StoreError` when the id exists."""
        if not session_id:
            raise StoreError("session id must be a non-empty string")
        if self._session_meta(session_id) is not None:
            raise StoreError(f"session {session_id!r} already exists")
        self._insert_session(session_id, dict(meta or {}))

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
            g = self._graphs.get(session_id)
            if g is None:
                self.session_meta(session_id)
                g = ContextGraph(session_id, self._read_events(session_id))
                self._graphs[session_id] = g
            elif self._event_count(session_id) > len(g):  # another instance appended
                g.extend(self._read_events_from(session_id, len(g)))
            return g

    def messages(self, session_id: str) -> list[Message]:
        """The stored events, exactly as appended."""
        self.session_meta(session_id)
        return self._read_events(session_id)

    def append(self, session_id: str, messages: Sequence[Message] | Message) -> list[int]:
        """Validate and append events; returns their positions.

        Raises:
            StoreError: unknown session.
            EventError/GraphError: an event is invalid; nothing of the batch is written.
        """
        batch = [messages] if isinstance(messages, Message) else list(messages)
        for i, m in enumerate(batch):
            if not isinstance(m, Message):
                raise TypeError(f"append: item {i} is {type(m).__name__}, expected Message")
        with self._session_lock(session_id):
            with self._write_transaction(session_id):
                g = self.graph(session_id)  # caught up inside the transaction
                g.validate(batch)  # the whole batch, before anything is written
                self._write_events(session_id, len(g), batch)
            return [g.append(m) for m in batch]
