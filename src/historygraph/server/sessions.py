"""Which stored session a proxied request belongs to, and which of its messages are new.

Chat APIs are stateless: every request carries the whole conversation. The proxy keeps one
append-only graph per conversation and, per request:

1. **Root id.** The ``X-HistoryGraph-Session`` header if given, else ``auto-`` followed by the
   first 16 hex digits of the SHA-256 of the canonical JSON (sorted keys) of the conversation's
   system messages and its first user message, i.e. every message up to and including the first
   ``user`` message (:func:`derived_session_id`). Two requests that start the same way therefore
   share a root.
2. **Diff.** The root and its branches (``<root>~1``, ``<root>~2`` … created in that order) are
   compared with the incoming messages (role, text, tool calls, tool-call id). A stored session
   that is a prefix of the request receives the rest: a client re-sending its whole history stores
   only the new events. Among several such sessions the longest wins.
3. **Branch.** When no stored session is a prefix (the client edited or dropped earlier messages,
   or retried a request whose answer was already stored), a new branch is created holding the
   request's messages; its meta names the parent and the position where they part. Nothing stored
   is overwritten.

After :meth:`SessionRouter.ingest` the session's graph equals the request's messages, so graph
position ``i`` is incoming message ``i``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Sequence

from ..events import Message
from ..graph import ContextGraph
from ..store import AppendConflict, Store, StoreError

SESSION_HEADER = "x-historygraph-session"


def derived_session_id(messages: Sequence[Message]) -> str:
    """``auto-`` + 16 hex digits of SHA-256 over the messages up to the first user message."""
    head: list[dict] = []
    for m in messages:
        head.append({"role": m.role, "content": m.content})
        if m.role == "user":
            break
    digest = hashlib.sha256(json.dumps(head, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return f"auto-{digest[:16]}"


def same_event(a: Message, b: Message) -> bool:
    """Whether two events are the same turn (timestamps and render marks are ignored)."""
    return (a.role == b.role and a.content == b.content and a.tool_call_id == b.tool_call_id
            and a.tool_calls == b.tool_calls and a.provider_blocks == b.provider_blocks)


def common_prefix(stored: Sequence[Message], incoming: Sequence[Message]) -> int:
    n = 0
    for a, b in zip(stored, incoming):
        if not same_event(a, b):
            break
        n += 1
    return n


@dataclass
class Ingest:
    """Result of routing one request: the session used, events appended, and whether a branch
    was created (``forked_from`` names its parent)."""

    session_id: str
    appended: int
    forked_from: str | None = None


class SessionRouter:
    """Routes requests to sessions of ``store``; one lock per root makes routing and appends of
    one conversation sequential within this process (the store makes them safe across
    processes)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()

    def lock(self, session_id: str) -> threading.RLock:
        root = session_id.split("~", 1)[0]
        with self._guard:
            return self._locks.setdefault(root, threading.RLock())

    def branches(self, root: str) -> list[str]:
        return self.store.sessions_with_prefix(root + "~")

    def ingest(self, messages: Sequence[Message], session_id: str | None = None, meta: dict | None = None) -> Ingest:
        """Store what is new in ``messages`` (see module docstring).

        Raises:
            EventError/GraphError: the new events are invalid (nothing is written).
        """
        root = session_id or derived_session_id(messages)
        with self.lock(root):
            if not self.store.has_session(root):
                ContextGraph(root, messages)  # invalid events raise before anything is created
                try:
                    self.store.create_session(root, dict(meta or {}))
                except StoreError:  # another instance created it meanwhile
                    pass
            best, best_len, parent, parent_len = None, -1, root, -1
            for sid in [root] + self.branches(root):
                stored = self.store.graph(sid).messages
                n = common_prefix(stored, messages)
                if n == len(stored) and n > best_len:
                    best, best_len = sid, n
                if n > parent_len:
                    parent, parent_len = sid, n
            if best is not None:
                new = list(messages[best_len:])
                if new:
                    try:  # expected_length: another process serving this store may have appended meanwhile
                        self.store.append(best, new, expected_length=best_len)
                    except AppendConflict:
                        return self.ingest(messages, session_id, meta)  # compare again with what is stored now
                return Ingest(best, len(new))
            return self._branch(root, parent, parent_len, messages, meta)

    def _branch(self, root: str, parent: str, at: int, messages: Sequence[Message], meta: dict | None) -> Ingest:
        ContextGraph(root, messages)  # invalid events raise before the branch is created
        k = len(self.branches(root)) + 1
        while True:
            sid = f"{root}~{k}"
            try:
                self.store.create_session(sid, {**(meta or {}), "parent": parent, "forked_at": at})
                break
            except StoreError:
                k += 1
        self.store.append(sid, list(messages))
        return Ingest(sid, len(messages), forked_from=parent)
