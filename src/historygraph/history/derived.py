"""Derived per-message state that a stored session keeps beside its events (issue 13).

Some facts about a session's messages are pure functions of the stored messages: the Tool-Flow
Analysis values of a message (ContextRender, arXiv:2609.37743, §3.2 and A.2), the files,
identifiers and test run of a ContextWeaver step (§3.1, §3.3), the parents the low-cost selector
picks for it, the learned selector's facts of a tool result. Computing them is regular-expression
work per message, which a process that reopens a session would otherwise redo for the whole
history before its first render. A store keeps them instead, as rows
``(kind, version, position, data)`` of the session:

* **kind** (:class:`DerivedKind`) names what is computed; **position** the message it belongs to
  (its graph position); **data** is the value as JSON text.
* **version** is a digest of the source files of the modules that compute the kind and of the
  Python version (:func:`source_version`). Any change to that code gives another version, so rows
  an older release wrote are not used: the value is computed again, and the session's rows of the
  kind with another version are deleted at the next write. A row whose value also depends on
  other messages records what it depended on (a step's result positions) and is used only when
  that still holds; the consumer checks it.
* Reading: :meth:`~historygraph.store.base.Store.graph` reads a session's rows with its events
  (one query each) into the graph's :class:`Derived`; a consumer takes the table of its kind
  (:meth:`Derived.table`), decoded as one JSON document for all its rows, by msgspec's C parser
  (about twice as fast as ``json`` on these rows; the same values: what it refuses, such as a
  ``NaN`` literal, is parsed by ``json``).
* Writing: what a graph handed out by a store computes is collected (:meth:`Derived.put`) and
  written by the store in the transaction of the session's next append, by
  :meth:`~historygraph.store.base.Store.flush` and by ``close()``. Rows are disposable: losing
  unwritten ones (a process killed, a graph dropped from a bounded graph cache) only means
  computing them again, and nothing here ever changes an event.

A graph built directly (``ContextGraph(...)``, not by a store) gets a :class:`Derived` without
rows that collects nothing; its consumers keep their in-process caches as before.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import sys
import threading
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Iterable

import msgspec
import numpy as np

Row = tuple[str, str, int, str]
"""One stored row: ``(kind name, version, position, JSON data)``."""

_decode = msgspec.json.Decoder().decode


def loads(text: str) -> Any:
    """:func:`json.loads` of ``text``, by msgspec's C parser (``json.loads`` itself for what msgspec
    refuses: the ``NaN`` and ``Infinity`` that ``json.dumps`` writes); also the stores' reader of
    their stored events."""
    try:
        return _decode(text)
    except msgspec.DecodeError:
        return json.loads(text)


@cache
def source_version(modules: tuple[str, ...]) -> str:
    """The version of a kind computed by ``modules`` (dotted names): the first 16 hex digits of the
    SHA-256 of the Python version (major.minor, for the ``re`` module) and of each module's source
    file. A module without a source file (a frozen or zipped install) gives a version unique to
    this process, so no stored row is ever trusted for it."""
    h = hashlib.sha256(f"python {sys.version_info[0]}.{sys.version_info[1]}".encode())
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin is None or not origin.endswith(".py") or not Path(origin).is_file():
            return f"unversioned-{uuid.uuid4().hex[:16]}"
        h.update(name.encode() + b"\0" + Path(origin).read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class DerivedKind:
    """What a row holds: ``name`` (e.g. ``"steps.features"``) and the ``modules`` whose source
    makes its :attr:`version`."""

    name: str
    modules: tuple[str, ...]

    @property
    def version(self) -> str:
        return source_version(self.modules)


SNAPSHOT_MIN = 64
"""Messages a graph holds before a per-graph snapshot (a step view, learned's facts, the BM25
index) is kept with it."""
SNAPSHOT_GROWTH = 1.25
"""A snapshot is replaced once the graph holds this many times the messages of the last one
(amortised O(1) per message: each snapshot is O(n))."""


def snapshot_due(messages: int, kept: int) -> bool:
    """Whether a graph of ``messages`` messages whose last snapshot (read or put) was taken at
    ``kept`` messages should put a new one (:data:`SNAPSHOT_MIN`, :data:`SNAPSHOT_GROWTH`)."""
    return messages >= SNAPSHOT_MIN and messages >= SNAPSHOT_GROWTH * kept


def pack_array(a: np.ndarray) -> list:
    """``[dtype, shape, base64 of the bytes, stored dtype]``: the bytes in the narrowest of
    ``uint8`` / ``int32`` that gives back the same bytes (0/1 flags, row numbers), else as they are."""
    a = np.ascontiguousarray(a)
    stored = a
    for narrow in (np.uint8, np.int32):
        if a.dtype.itemsize > np.dtype(narrow).itemsize and a.size:
            with np.errstate(invalid="ignore", over="ignore"):
                c = a.astype(narrow)
            if c.astype(a.dtype).tobytes() == a.tobytes():
                stored = c
                break
    return [a.dtype.str, list(a.shape), base64.b64encode(stored.tobytes()).decode(), stored.dtype.str]


def unpack_array(d: list) -> np.ndarray:
    """The array :func:`pack_array` packed (its own dtype and shape)."""
    dtype, shape, data, stored = d
    return np.frombuffer(base64.b64decode(data), dtype=np.dtype(stored)).astype(np.dtype(dtype)).reshape(shape)


class Derived:
    """The derived rows of one graph: those read from the store, and those computed since.

    Args:
        rows: stored rows (:data:`Row`), any kinds and versions.
        persist: collect what :meth:`put` is given for the store to write (a graph from a store);
            ``False``: :meth:`put` keeps nothing.

    Thread-safe: renders of one graph in several threads may take tables and put rows.
    """

    def __init__(self, rows: Iterable[Row] = (), persist: bool = False) -> None:
        self.persist = persist
        self._raw: dict[str, dict[str, dict[int, str]]] = {}  # name -> version -> position -> JSON
        for name, version, position, data in rows:
            self._raw.setdefault(name, {}).setdefault(version, {})[position] = data
        self._tables: dict[DerivedKind, dict[int, Any]] = {}
        self._pending: dict[tuple[str, int], Row] = {}
        self._stale: set[tuple[str, str]] = set()  # (name, current version): rows of other versions to delete
        self._lock = threading.Lock()

    def table(self, kind: DerivedKind) -> dict[int, Any]:
        """The stored values of ``kind`` (its current version) by position, decoded from JSON on
        the first call (lists for arrays); later calls return the same dict, from which a consumer
        may ``pop`` what it has taken over. Rows of other versions of the kind are dropped and,
        when persisting, marked for deletion from the store."""
        t = self._tables.get(kind)
        if t is not None:
            return t
        with self._lock:
            t = self._tables.get(kind)
            if t is None:
                versions = self._raw.pop(kind.name, {})
                raw = versions.pop(kind.version, {})
                if versions and self.persist:
                    self._stale.add((kind.name, kind.version))
                t = dict(zip(raw, loads("[" + ",".join(raw.values()) + "]"))) if raw else {}
                self._tables[kind] = t
        return t

    def take_text(self, kind: DerivedKind, position: int) -> str | None:
        """:meth:`take_value` without decoding: the row's JSON text, or ``None`` (for a snapshot
        whose parts are decoded when used, e.g. with a :class:`msgspec.Raw` per key)."""
        decoded, v = self._take(kind, position)
        if decoded:
            return None if v is None else json.dumps(v, ensure_ascii=False, separators=(",", ":"))
        return v

    def take_value(self, kind: DerivedKind, position: int) -> Any:
        """The stored value of ``kind`` (its current version) at ``position``, or ``None``; taken
        out (a later :meth:`table` or call here does not return it). Decodes only that row when
        the kind's table has not been decoded, so a consumer that needs a few rows of a long
        session does not pay for all of them. Rows of other versions of the kind are dropped and,
        when persisting, marked for deletion from the store (as by :meth:`table`)."""
        decoded, v = self._take(kind, position)
        return v if decoded or v is None else loads(v)

    def _take(self, kind: DerivedKind, position: int) -> tuple[bool, Any]:
        """The row of ``kind`` at ``position``, taken out: ``(True, value)`` from a decoded table,
        else ``(False, its JSON text or None)``. Rows of other versions of the kind are dropped and,
        when persisting, marked for deletion from the store (as by :meth:`table`)."""
        t = self._tables.get(kind)
        if t is not None:
            return True, t.pop(position, None)
        with self._lock:
            t = self._tables.get(kind)
            if t is not None:
                return True, t.pop(position, None)
            versions = self._raw.get(kind.name)
            if versions and len(versions) > (kind.version in versions):  # rows of other versions: as table() does
                for v in [v for v in versions if v != kind.version]:
                    del versions[v]
                if self.persist:
                    self._stale.add((kind.name, kind.version))
            raw = versions.get(kind.version) if versions else None
            return False, (raw.pop(position, None) if raw is not None else None)

    def put(self, kind: DerivedKind, position: int, value: Any) -> None:
        """Record the value of ``kind`` at ``position`` (JSON-serialisable; tuples come back as
        lists) for the store to write; a later value for the same kind and position replaces it.
        Does not change :meth:`table`. No-op unless persisting."""
        if self.persist:
            row = (kind.name, kind.version, position, json.dumps(value, ensure_ascii=False, separators=(",", ":")))
            with self._lock:
                self._pending[(kind.name, position)] = row

    def put_json(self, kind: DerivedKind, position: int, text: str) -> None:
        """:meth:`put` of a value already encoded as JSON ``text`` (a large snapshot encoded by a
        faster encoder than :func:`json.dumps`). No-op unless persisting."""
        if self.persist:
            with self._lock:
                self._pending[(kind.name, position)] = (kind.name, kind.version, position, text)

    def take(self) -> tuple[list[Row], list[tuple[str, str]]]:
        """The rows to write and the ``(kind name, current version)`` pairs whose other versions to
        delete, emptied here (a store calls it inside the transaction that writes them)."""
        with self._lock:
            rows, stale = list(self._pending.values()), sorted(self._stale)
            self._pending.clear()
            self._stale.clear()
        return rows, stale
