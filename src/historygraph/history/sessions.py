"""Which stored session a proxied request belongs to, and which of its messages are new.

Chat APIs are stateless: every request carries the whole conversation. The proxy keeps one
append-only graph per conversation and, per request:

1. **Root id.** The ``X-HistoryGraph-Session`` header if given, else the conversation's
   *opening* ``auto-`` followed by the first 16 hex digits of the SHA-256 of the canonical JSON
   (sorted keys) of the conversation's system messages and its first user message, i.e. every
   message up to and including the first ``user`` message (:func:`derived_session_id`). Requests
   that start the same way share an opening, which may hold several chats (see 4.).
2. **Diff.** The root and its branches (``<root>~1``, ``<root>~2`` … created in that order) are
   compared with the incoming messages (role, text, tool calls, tool-call id) as the provider
   reads them, not byte for byte (:func:`same_event`): a client that echoes an answer back with
   its ``null`` fields dropped (``model_dump(exclude_none=True)``), its keys in another order, or
   its tool-call arguments re-serialised continues the session. A stored session
   that is a prefix of the request receives the rest: a client re-sending its whole history stores
   only the new events. Among several such sessions the longest wins.
3. **Branch.** When no stored session is a prefix (the client edited or dropped earlier messages,
   or retried a request whose answer was already stored), a new branch is created holding the
   request's messages; its meta names the parent and the position where they part. Nothing stored
   is overwritten. The branch is created on the base ``(parent, position)``
   (:meth:`Store.create_session`): the events the two share are read from the parent, not copied,
   so a client that restates its context before every new turn (aider: a branch per request) stores
   O(n) events over a chat of n requests, not O(n²). A new chat of an opening (4.) shares its
   opening with the session of the opening it has most in common with, the same way.
4. **New chats** (derived ids only; the header names one conversation whatever it holds). Clients
   open every chat the same way (aider: its system prompt and a fixed example exchange), so a
   request that no stored session continues is not taken for an edit of another chat unless it
   repeats one of that chat's answers: an assistant message the proxy stored as an answer there
   (:meth:`SessionRouter.note_answer`), or that a request appended to it, indexed by its content
   and tool-call ids (store texts of kind :data:`ANSWER_KIND`, key :func:`answer_key`). It is
   then a branch of that chat (3.); otherwise a new chat ``<opening>.<k>`` (k = 2, 3 …; meta
   ``opening``) is created holding the request, and its own answers route its later requests to
   it. Two chats whose model answers are identical cannot be told apart this way: name them with
   the header.

**Session ids** (:func:`session_id_problem`): a client names a session with any text of 1 to
:data:`MAX_SESSION_ID` characters without control characters (U+0000–U+001F, U+007F), ``/``,
spaces and any other Unicode included; the session API reads it with the id percent-encoded as
one path segment. Branch ids append ``~<n>``, further chats of one opening ``.<k>``.

After :meth:`SessionRouter.ingest` the session's graph equals the request's messages, so graph
position ``i`` is incoming message ``i``.

**Answers** (:meth:`SessionRouter.store_answer`): the upstream's answer to a request is stored
after the request's messages, at the position the request left the session at. Requests of one
conversation may be in flight together (three agents started at once with the same first
request: one session, three answers coming): the first answer is appended, and an answer whose
position another answer took meanwhile is stored in a new branch holding the request's messages
(shared with the session) and this answer, so that no session ever holds two answers in a row to
one request, tool calls without their results between them.

**Incremental comparison.** An agent re-sends its whole history with every request, so comparing
it with the stored session event by event, after parsing every message, costs O(history) in
Python per request. The router therefore remembers, per session (an LRU of ``prefix_cache``
sessions per process), the client's own JSON objects of the messages it last stored there
(the ``raw`` of a request's messages, :class:`historygraph.providers.openai_chat.RequestMessages`:
the proxy's OpenAI endpoint keeps each message's bytes as the client sent them, unparsed). Stored positions never change (sessions are append-only,
branches are other sessions), so when the leading messages of a request are equal (as bytes, or
as JSON values) to the remembered ones, they equal the stored events: that prefix is recognised
by one C-level list comparison and is neither parsed nor compared again (a message re-sent with
other bytes for the same value, e.g. its keys in another order, is parsed and compared). Comparison and parsing resume
at the first message that differs or is new; an edited earlier message therefore differs there
and is compared event by event, exactly as without the cache, and events another process
appended meanwhile are read from the store (:meth:`Store.graph` catches up by length).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Sequence

from historygraph.history.events import CACHE_MARK, Message
from historygraph.history.graph import ContextGraph
from historygraph.store import AppendConflict, Store, StoreError

SESSION_HEADER = "x-historygraph-session"

ANSWER_KIND = "answer"
"""Store text kind of the answer index (module docstring, 4.): key :func:`answer_key`, value the
chat's root id."""
_DERIVED = re.compile(r"(auto-[0-9a-f]{16})(?:\.[0-9]+)?")


def derived_session_id(messages: Sequence[Message]) -> str:
    """``auto-`` + 16 hex digits of SHA-256 over the messages up to the first user message."""
    head: list[dict] = []
    for m in messages:
        head.append({"role": m.role, "content": m.content})
        if m.role == "user":
            break
    digest = hashlib.sha256(json.dumps(head, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return f"auto-{digest[:16]}"


def opening_of(session_id: str) -> str | None:
    """The opening (``auto-<16 hex>``) of a derived session id, chat or branch, else ``None``."""
    m = _DERIVED.fullmatch(session_id.split("~", 1)[0])
    return m.group(1) if m else None


def answer_key(opening: str, answer: Message) -> str:
    """Key of ``answer`` in the answer index of ``opening``: 32 hex digits of the SHA-256 of the
    JSON of its text, stripped of leading and trailing white space (aider echoes an answer
    stripped), and its tool calls' ids and names (ids are the provider's, unique per call)."""
    value = json.dumps([answer.content.strip(), [[c.id, c.name] for c in answer.tool_calls]], ensure_ascii=False)
    return f"{opening}:{hashlib.sha256(value.encode()).hexdigest()[:32]}"


MAX_SESSION_ID = 512
"""Characters a client-given session id may have at most (:func:`session_id_problem`)."""


def session_id_problem(session_id: str) -> str | None:
    """Why ``session_id`` cannot name a new session, or ``None`` when it can: it must be 1 to
    :data:`MAX_SESSION_ID` characters without control characters (a NUL cannot be stored on
    PostgreSQL; the others break headers and log lines)."""
    if not session_id:
        return "a session id must not be empty"
    if len(session_id) > MAX_SESSION_ID:
        return f"a session id has at most {MAX_SESSION_ID} characters, this one {len(session_id)}"
    if bad := next((c for c in session_id if ord(c) < 0x20 or ord(c) == 0x7F), None):
        return f"a session id must not hold control characters, this one holds {bad!r}"
    return None


def same_event(a: Message, b: Message) -> bool:
    """Whether two events are the same turn (timestamps and render marks are ignored), compared as
    the provider reads them: tool-call arguments as JSON values (whatever their spacing or key
    order) and provider blocks with ``null`` fields counting as absent, at any depth (a client's
    SDK drops them when it echoes an answer back, as ``model_dump(exclude_none=True)`` does), and
    a block's ``cache_control`` too (:data:`~historygraph.history.events.CACHE_MARK`: stores
    written before it was left out of the stored blocks hold the mark the client later moved)."""
    return (a.role == b.role and a.content == b.content and a.tool_call_id == b.tool_call_id
            and (a.media == b.media or _same_json(a.media, b.media, nulls=False))
            and (a.tool_calls == b.tool_calls or _same_calls(a, b))
            and (a.provider_blocks == b.provider_blocks or _same_json(a.provider_blocks, b.provider_blocks, nulls=False)))


def _same_calls(a: Message, b: Message) -> bool:
    return len(a.tool_calls) == len(b.tool_calls) and all(
        x.id == y.id and x.name == y.name and (x.arguments == y.arguments or _same_json(x.arguments, y.arguments))
        for x, y in zip(a.tool_calls, b.tool_calls))


def _same_json(x: str, y: str, nulls: bool = True) -> bool:
    """Whether two JSON texts hold the same value (``nulls=False``: ``null`` and ``cache_control``
    members of objects left out first); texts that are not JSON are different unless equal."""
    try:
        u, v = json.loads(x), json.loads(y)
    except ValueError:
        return False
    return u == v if nulls else _without_nulls(u) == _without_nulls(v)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None and k != CACHE_MARK}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def stamped(messages: Sequence[Message], arrived: float | None) -> list[Message]:
    """``messages``, each without a timestamp given ``arrived`` (seconds since the epoch; ``None``:
    as they are)."""
    if arrived is None:
        return list(messages)
    return [m if m.timestamp is not None else replace(m, timestamp=arrived) for m in messages]


def common_prefix(stored: Sequence[Message], incoming: Sequence[Message], start: int = 0) -> int:
    """Length of the common prefix of ``stored`` and ``incoming`` (:func:`same_event`), their
    first ``start`` events being known equal (not compared again)."""
    end = min(len(stored), len(incoming))
    n = min(start, end)
    while n < end and same_event(stored[n], incoming[n]):
        n += 1
    return n


def raw_of(messages: Sequence[Message]) -> list[Any] | None:
    """The client's JSON of each of ``messages`` (their ``raw``, a list, as
    :class:`historygraph.providers.openai_chat.RequestMessages` keeps it), or ``None`` (a plain
    sequence of messages)."""
    raw = getattr(messages, "raw", None)
    return raw if isinstance(raw, list) else None


def known_prefix(cached: list[Any] | None, raw: list[Any]) -> int:
    """How many leading items of ``raw`` equal those of ``cached`` (as JSON values)."""
    if not cached:
        return 0
    n = min(len(cached), len(raw))
    if cached[:n] == raw[:n]:  # the common case, one comparison in C
        return n
    for i in range(n):
        if cached[i] != raw[i]:
            return i
    return n


@dataclass
class Ingest:
    """Result of routing one request: the session used, events appended, whether a branch was
    created (``forked_from`` names its parent), whether the session was created for this request
    (``created``: a new session or chat, or a branch; it holds the whole request), and the
    session's graph as this request left it (its events are the request's messages)."""

    session_id: str
    appended: int
    forked_from: str | None = None
    graph: ContextGraph | None = None
    created: bool = False


class SessionRouter:
    """Routes requests to sessions of ``store``; one lock per root makes routing and appends of
    one conversation sequential within this process (the store makes them safe across
    processes)."""

    def __init__(self, store: Store, prefix_cache: int = 256) -> None:
        self.store = store
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        self.prefix_cache = prefix_cache  # sessions whose last stored client messages are remembered
        self._raw: OrderedDict[str, list[Any]] = OrderedDict()  # session id -> client JSON of its events 0..k-1
        self._known: set[str] = set()  # sessions seen to exist (sessions are never deleted)

    def _cached_raw(self, session_id: str) -> list[Any] | None:
        with self._guard:
            raw = self._raw.get(session_id)
            if raw is not None:
                self._raw.move_to_end(session_id)
            return raw

    def _remember(self, session_id: str, raw: list[Any]) -> None:
        """``raw``: the client's JSON of the session's stored events 0..len(raw)−1."""
        if self.prefix_cache < 1:
            return
        with self._guard:
            self._raw[session_id] = raw
            self._raw.move_to_end(session_id)
            while len(self._raw) > self.prefix_cache:
                self._raw.popitem(last=False)

    def _exists(self, session_id: str) -> bool:
        if session_id in self._known:
            return True
        if self.store.has_session(session_id):
            self._known.add(session_id)
            return True
        return False

    def lock(self, session_id: str) -> threading.RLock:
        """The lock of ``session_id``'s root (of its opening, for a derived id: every chat of an
        opening is routed under one lock)."""
        root = opening_of(session_id) or session_id.split("~", 1)[0]
        with self._guard:
            return self._locks.setdefault(root, threading.RLock())

    def branches(self, root: str) -> list[str]:
        return self.store.sessions_with_prefix(root + "~")

    def family(self, opening: str) -> list[str]:
        """Every chat of a derived ``opening`` and their branches, the opening's own first."""
        return [opening] + [s for s in self.store.sessions_with_prefix(opening) if len(s) > len(opening) and s[len(opening)] in "~."]

    def note_answer(self, session_id: str, answer: Message) -> None:
        """Index ``answer``, stored in ``session_id``, as an answer of its chat (module docstring,
        4.); nothing for a session the header named, or for a message that is no assistant's."""
        opening = opening_of(session_id)
        if opening is not None and answer.role == "assistant":
            self.store.put_text(ANSWER_KIND, answer_key(opening, answer), session_id.split("~", 1)[0])

    def _chat(self, opening: str, messages: Sequence[Message]) -> str | None:
        """The chat of ``opening`` one of whose answers ``messages`` repeats (the newest first)."""
        for i in range(len(messages) - 1, -1, -1):
            m = messages[i]
            if m.role == "assistant" and (chat := self.store.get_text(ANSWER_KIND, answer_key(opening, m))) is not None:
                if self._exists(chat):
                    return chat
        return None

    def ingest(self, messages: Sequence[Message], session_id: str | None = None, meta: dict | None = None,
               arrived: float | None = None) -> Ingest:
        """Store what is new in ``messages`` (see module docstring). When ``messages`` also has
        ``raw``, the client's JSON of each message (a list, item ``i`` standing for message ``i``:
        :class:`historygraph.providers.openai_chat.RequestMessages`), the prefix equal to what this
        router last stored in a session is recognised without parsing or comparing it ("Incremental
        comparison"). ``arrived``: the
        request's time (seconds since the epoch), stored as the timestamp of each new message that
        has none (a cache-stable policy reads the pauses between requests from them).

        Raises:
            EventError/GraphError: the new events are invalid (nothing is written).
        """
        raw = raw_of(messages)
        opening = None if session_id else derived_session_id(messages)
        root = session_id or opening
        assert root is not None
        with self.lock(root):
            created = not self._exists(root)
            if created:
                ContextGraph(root).validate(messages, "message #{}".format)  # invalid events raise before anything is created
                try:
                    self.store.create_session(root, dict(meta or {}))
                except StoreError:  # another instance created it meanwhile
                    pass
                self._known.add(root)
            best, best_len, best_graph = None, -1, None
            shared: dict[str, int] = {}  # session -> events it shares with the request
            for sid in [root] + self.branches(root) if opening is None else self.family(opening):
                graph = self.store.graph(sid)
                stored = graph.messages
                start = min(known_prefix(self._cached_raw(sid), raw), len(stored)) if raw is not None else 0
                n = shared[sid] = common_prefix(stored, messages, start)
                if n == len(stored) and n > best_len:
                    best, best_len, best_graph = sid, n, graph
            if best is not None:
                new = stamped(messages[best_len:], arrived)
                if new:
                    try:  # expected_length: another process serving this store may have appended meanwhile
                        self.store.append(best, new, expected_length=best_len)
                    except AppendConflict:
                        return self.ingest(messages, session_id, meta, arrived)  # compare again with what is stored now
                if raw is not None:
                    self._remember(best, list(raw))
                if best_graph is None or len(best_graph) != best_len + len(new):  # dropped from the store's cache meanwhile
                    best_graph = self.store.graph(best)
                if best_len > 0:  # answers a client appended (the library's agent loops store them so)
                    for m in new:
                        self.note_answer(best, m)
                return Ingest(best, len(new), graph=best_graph, created=created)
            chat = root if opening is None else self._chat(opening, messages)
            if chat is None:
                assert opening is not None
                return self._new_chat(opening, messages, meta, shared, arrived)
            parent = max((s for s in shared if s == chat or s.startswith(chat + "~")), key=lambda s: shared[s])
            return self._branch(chat, parent, shared[parent], messages, meta, arrived)

    def _new_chat(self, opening: str, messages: Sequence[Message], meta: dict | None, shared: dict[str, int],
                  arrived: float | None = None) -> Ingest:
        """A new chat ``<opening>.<k>`` holding ``messages`` (module docstring, 4.), on the base of
        the session of the opening it shares most events with (``shared``: session -> events)."""
        ContextGraph(opening).validate(messages, "message #{}".format)
        base = max(shared, key=lambda s: shared[s], default=None)
        k = 1 + sum(1 for s in self.family(opening) if "~" not in s)
        while True:
            sid = f"{opening}.{k}"
            try:
                self.store.create_session(sid, {**(meta or {}), "opening": opening},
                                          base=(base, shared[base]) if base is not None and shared[base] else None)
                break
            except StoreError:
                k += 1
        return self._fill(sid, messages, shared.get(base, 0) if base is not None else 0, arrived=arrived)

    def _branch(self, root: str, parent: str, at: int, messages: Sequence[Message], meta: dict | None,
                arrived: float | None = None) -> Ingest:
        """A new branch ``<root>~<k>`` holding ``messages``, on the base ``(parent, at)``: its
        first ``at`` events are ``parent``'s (equal to those of ``messages``, :func:`same_event`)."""
        ContextGraph(root).validate(messages, "message #{}".format)  # invalid events raise before the branch is created
        k = len(self.branches(root)) + 1
        while True:
            sid = f"{root}~{k}"
            try:
                self.store.create_session(sid, {**(meta or {}), "parent": parent, "forked_at": at}, base=(parent, at))
                break
            except StoreError:
                k += 1
        return self._fill(sid, messages, at, forked_from=parent, arrived=arrived)

    def _fill(self, sid: str, messages: Sequence[Message], at: int, forked_from: str | None = None,
              arrived: float | None = None) -> Ingest:
        """Append ``messages[at:]`` to the session just created holding the first ``at``."""
        self._known.add(sid)
        if len(messages) > at:
            self.store.append(sid, stamped(messages[at:], arrived), expected_length=at)
        raw = raw_of(messages)
        if raw is not None:
            self._remember(sid, list(raw))
        return Ingest(sid, len(messages), forked_from=forked_from, graph=self.store.graph(sid), created=True)

    def store_answer(self, session_id: str, answer: Message, at: int | None = None) -> str:
        """Store ``answer``, the upstream's answer to a request that left ``session_id`` holding
        ``at`` events (module docstring, "Answers"): appended there, or, when another answer took
        that position meanwhile, in a new branch on the base ``(session_id, at)`` (nothing when the
        event stored there is this answer: the client's next request brought it first).
        ``at=None``: appended wherever the session ends. Returns the session that holds it.

        Raises:
            EventError/GraphError: the answer is invalid after those events (nothing is written).
            StoreFullError: the store's disk is full.
        """
        with self.lock(session_id):
            try:
                self.store.append(session_id, answer, expected_length=at)
                target = session_id
            except AppendConflict:
                assert at is not None
                stored = self.store.graph(session_id).messages
                if len(stored) > at and same_event(stored[at], answer):
                    return session_id
                root = session_id.split("~", 1)[0]
                target = self._branch(root, session_id, at, [*stored[:at], answer], None).session_id
            self.note_answer(target, answer)
            return target
