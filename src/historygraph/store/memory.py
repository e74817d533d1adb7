"""In-memory store: the same contract as SQLite, nothing persisted (tests, short library use)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from historygraph.history.derived import Row
from historygraph.history.events import Message
from historygraph.store.base import Store


class MemoryStore(Store):
    def __init__(self) -> None:
        super().__init__()
        self._meta: dict[str, dict[str, Any]] = {}
        self._events: dict[str, list[Message]] = {}  # per session, its own events (from its base's k on)
        self._base_of: dict[str, tuple[str, int]] = {}
        self._emb: dict[str, np.ndarray] = {}
        self._texts: dict[tuple[str, str], str] = {}
        self._keys: dict[str, dict[str, tuple[str, int, int]]] = {}  # per session, oldest first
        self._derived: dict[str, dict[tuple[str, int], Row]] = {}  # per session, by (kind, position)
        self._pins: dict[str, set[int]] = {}
        self._omitted: dict[str, list[str]] = {}  # per session, oldest first
        self._policy_state: dict[tuple[str, str], str] = {}  # (session, key) -> value

    def _insert_session(self, session_id: str, meta: dict[str, Any], base: tuple[str, int] | None = None) -> bool:
        with self._graph_lock:
            if session_id in self._meta:
                return False
            self._meta[session_id] = meta
            self._events[session_id] = []
            if base is not None:
                self._base_of[session_id] = base
            return True

    def _read_base(self, session_id: str) -> tuple[str, int] | None:
        return self._base_of.get(session_id)

    def _start(self, session_id: str) -> int:
        base = self._base_of.get(session_id)
        return base[1] if base else 0

    def _session_meta(self, session_id: str) -> dict[str, Any] | None:
        meta = self._meta.get(session_id)
        return dict(meta) if meta is not None else None

    def _write_events(self, session_id: str, start: int, messages: Sequence[Message]) -> None:
        assert self._start(session_id) + len(self._events[session_id]) == start
        self._events[session_id].extend(messages)

    def _read_events_from(self, session_id: str, start: int, stop: int | None = None) -> list[Message]:
        k = self._start(session_id)
        return self._events[session_id][max(start - k, 0):None if stop is None else max(stop - k, 0)]

    def _event_count(self, session_id: str) -> int:
        own = len(self._events[session_id])
        return self._start(session_id) + own if own else 0

    def _read_append_key(self, session_id: str, key: str) -> tuple[str, int, int] | None:
        return self._keys.get(session_id, {}).get(key)

    def _write_append_key(self, session_id: str, key: str, fingerprint: str, start: int, count: int) -> None:
        keys = self._keys.setdefault(session_id, {})
        keys[key] = (fingerprint, start, count)
        while len(keys) > self.kept_keys:
            del keys[next(iter(keys))]

    def _read_derived(self, session_id: str) -> list[Row]:
        return list(self._derived.get(session_id, {}).values())

    def _write_derived(self, session_id: str, rows: Sequence[Row], stale: Sequence[tuple[str, str]]) -> None:
        table = self._derived.setdefault(session_id, {})
        for kind, version in stale:
            for key in [k for k, r in table.items() if r[0] == kind and r[1] != version]:
                del table[key]
        for row in rows:
            table[(row[0], row[2])] = row

    def _read_pins(self, session_id: str) -> list[int]:
        return list(self._pins.get(session_id, ()))

    def _write_pin(self, session_id: str, position: int, pinned: bool) -> None:
        pins = self._pins.setdefault(session_id, set())
        if pinned:
            pins.add(position)
        else:
            pins.discard(position)
    def _read_omitted(self, session_id: str) -> list[str]:
        return list(self._omitted.get(session_id, ()))

    def _write_omitted(self, session_id: str, records: Sequence[str]) -> None:
        self._omitted.setdefault(session_id, []).extend(records)

    def sessions(self) -> list[str]:
        return list(self._meta)

    def get_embeddings(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        return {k: self._emb[k] for k in keys if k in self._emb}

    def put_embeddings(self, items: dict[str, np.ndarray]) -> None:
        rows = {k: np.asarray(v, dtype=np.float32) for k, v in items.items()}  # all converted, or nothing stored
        for k, v in rows.items():
            self._emb.setdefault(k, v)

    def get_text(self, kind: str, key: str) -> str | None:
        return self._texts.get((kind, key))

    def put_text(self, kind: str, key: str, value: str) -> None:
        self._texts.setdefault((kind, key), value)

    def _read_policy_state(self, session_id: str, key: str) -> str | None:
        return self._policy_state.get((session_id, key))

    def _write_policy_state(self, session_id: str, key: str, value: str) -> None:
        self._policy_state[(session_id, key)] = value
