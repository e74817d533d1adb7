"""SQLite store, the embedded default (stdlib ``sqlite3``, WAL journal).

Location: the path the user gives, else ``historygraph.sqlite`` under the user's data directory
(``platformdirs.user_data_dir("historygraph")``), overridable with ``HISTORYGRAPH_DB``.

Schema: ``sessions(id, created, meta)``, ``events(session_id, position, data)`` with each event
stored as the JSON of :meth:`Message.to_dict` (lossless), and ``embeddings(key, vector)`` for the
content-hash cache (float32 bytes), ``texts(kind, key, value)`` for derived texts (summaries). A batch of events is written in one transaction.
``append_keys`` (:data:`APPEND_KEYS_TABLE`) holds the idempotency keys of appends, written in the
transaction of their events. ``derived`` (:data:`DERIVED_TABLE`) holds each session's derived
per-message rows (:mod:`historygraph.history.derived`). ``pins`` (:data:`PINS_TABLE`) holds each session's
pinned positions (:meth:`Store.pin`). ``omitted`` (:data:`OMITTED_TABLE`) holds each session's
omission records (:mod:`historygraph.render.omissions`). ``bases`` (:data:`BASES_TABLE`) holds the
base of each session created on one (:meth:`Store.create_session`: its first ``shared`` events are
its parent's, and its own rows start there). ``policy_state`` (:data:`POLICY_STATE_TABLE`)
holds what a policy keeps between renders of a session (:meth:`Store.policy_state`). ``schema_version`` holds the schema's version; opening a store
written by an earlier release migrates it forward (:data:`MIGRATIONS`,
:mod:`historygraph.store.migrations`).

Concurrency: one connection per store, serialised by a lock; an append runs in a
``BEGIN IMMEDIATE`` transaction (SQLite's single writer), inside which the events' primary key
refuses a batch whose start position another instance has stored meanwhile (the append is then
checked again after re-reading what is stored, :attr:`Store.checks_start`), so several store
instances, in one process or several, can share one file (WAL lets readers proceed meanwhile; a
writer waits up to 30 s for the lock). An append holds the lock for BEGIN, its INSERTs and COMMIT
only, no length query.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import platformdirs

from historygraph.history.derived import Row, loads
from historygraph.history.events import Message
from historygraph.store.base import SessionInfo, StaleGraph, Store
from historygraph.store.migrations import (OWN_COLUMNS, VERSION_TABLE, ForeignDatabaseError, Migration, pending,
                                           refuse_foreign_columns)

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, created REAL NOT NULL, meta TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL REFERENCES sessions(id), position INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (session_id, position));
CREATE TABLE IF NOT EXISTS embeddings (key TEXT PRIMARY KEY, vector BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS texts (kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (kind, key));
"""

APPEND_KEYS_TABLE = """
CREATE TABLE IF NOT EXISTS append_keys (
    id INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), key TEXT NOT NULL,
    fingerprint TEXT NOT NULL, start_position INTEGER NOT NULL, event_count INTEGER NOT NULL, UNIQUE (session_id, key));
CREATE INDEX IF NOT EXISTS append_keys_order ON append_keys (session_id, id);
"""
"""Added by issue 17 (idempotency keys, :meth:`Store.append`): migration 2, which adds the empty
table to a store created before it and changes nothing else."""

DERIVED_TABLE = """
CREATE TABLE derived (
    session_id TEXT NOT NULL REFERENCES sessions(id), kind TEXT NOT NULL, position INTEGER NOT NULL,
    version TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (session_id, kind, position)) WITHOUT ROWID;
"""
"""Added by issue 13 (first render of a reopened session): migration 3, an empty table of derived
rows (:mod:`historygraph.history.derived`), one per session, kind and message position; changes nothing
else."""

PINS_TABLE = """
CREATE TABLE pins (
    session_id TEXT NOT NULL REFERENCES sessions(id), position INTEGER NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (session_id, position)) WITHOUT ROWID;
"""
"""Added by issue 40 (pins, :meth:`Store.pin`): migration 4, an empty table of each session's pinned
positions (a row while pinned, deleted by an unpin); changes nothing else."""
OMITTED_TABLE = """
CREATE TABLE omitted (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), data TEXT NOT NULL);
CREATE INDEX omitted_order ON omitted (session_id, id);
"""
"""Added by issue 40 (what each rendering left out): migration 5, an empty append-only table of
omission records (:mod:`historygraph.render.omissions`), ordered by ``id``; changes nothing else."""

BASES_TABLE = """
CREATE TABLE bases (
    session_id TEXT PRIMARY KEY REFERENCES sessions(id), parent TEXT NOT NULL REFERENCES sessions(id),
    shared INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO bases (session_id, parent, shared)
SELECT id, parent, shared FROM (
    SELECT s.id AS id, p.id AS parent, coalesce(
        (SELECT min(e.position) FROM events e LEFT JOIN events q ON q.session_id = p.id AND q.position = e.position
         WHERE e.session_id = s.id AND e.position < json_extract(s.meta, '$.forked_at') AND q.data IS NOT e.data),
        min(json_extract(s.meta, '$.forked_at'), (SELECT count(*) FROM events c WHERE c.session_id = s.id))) AS shared
    FROM sessions s JOIN sessions p ON p.id = json_extract(s.meta, '$.parent') AND p.rowid < s.rowid
    WHERE json_type(s.meta, '$.forked_at') = 'integer')
WHERE shared > 0;
DELETE FROM events WHERE position < coalesce((SELECT b.shared FROM bases b WHERE b.session_id = events.session_id), 0)
"""
"""Added by issue 50 (branches share their common prefix, :meth:`Store.create_session`'s ``base``):
migration 6, a table of each session's base (parent and shared length). A branch stored before it
holds a copy of its parent's first ``forked_at`` events (its meta); the migration makes it read
the longest leading run of them whose stored JSON is equal to its parent's from the parent and
deletes its copies, so it reads back the same events (a parent created after the branch, which
only a hand-written meta could name, is left alone)."""
POLICY_STATE_TABLE = """
CREATE TABLE policy_state (
    session_id TEXT NOT NULL REFERENCES sessions(id), key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (session_id, key)) WITHOUT ROWID;
"""
"""Added by issue 49 (cache-stable rendering across proxy instances): migration 7, an empty table of
each session's policy state (:meth:`Store.policy_state`), one row per key, overwritten; changes
nothing else."""

MIGRATIONS = (
    Migration(1, "sessions, events, embeddings, texts", SCHEMA),
    Migration(2, "append_keys: idempotency keys of appends", APPEND_KEYS_TABLE),
    Migration(3, "derived: per-message derived rows of each session", DERIVED_TABLE),
    Migration(4, "pins: pinned items of each session", PINS_TABLE),
    Migration(5, "omitted: what each rendering of a session left out", OMITTED_TABLE),
    Migration(6, "bases: branches read their shared prefix from their parent", BASES_TABLE),
    Migration(7, "policy_state: what a policy keeps between renders of a session", POLICY_STATE_TABLE),
)
"""Forward migrations, in order (:mod:`historygraph.store.migrations`)."""
SCHEMA_VERSION = MIGRATIONS[-1].version


def default_path() -> Path:
    """``$HISTORYGRAPH_DB`` or ``<user data dir>/historygraph/historygraph.sqlite``."""
    env = os.environ.get("HISTORYGRAPH_DB")
    return Path(env) if env else Path(platformdirs.user_data_dir("historygraph")) / "historygraph.sqlite"


class SQLiteStore(Store):
    """Args: path: database file (created with its folder if missing); ``None`` = :func:`default_path`."""

    checks_start = True  # the events' primary key refuses a taken position: no length query per append

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        try:
            self._refuse_foreign()
        except BaseException:
            self._db.close()
            raise
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            self.schema_version = self._migrate()
        except BaseException:
            self._db.close()
            raise

    def _refuse_foreign(self) -> None:
        """Raise before anything is written when the file is not a historygraph store: another
        program's database (tables, none of ours; or tables named ``sessions`` and ``events``
        without our columns), a newer schema, or not a database at all."""
        try:
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = self._db.execute("SELECT version FROM schema_version").fetchone() if "schema_version" in tables else None
        except sqlite3.DatabaseError as exc:
            raise ForeignDatabaseError(f"{self.path} is not a SQLite database ({exc}): give --store (or HISTORYGRAPH_DB) "
                                       f"a new file or an existing historygraph store; the file was left as it was") from None
        if tables and "schema_version" not in tables and not {"sessions", "events"} <= tables:
            shown = ", ".join(sorted(tables)[:8]) + (", …" if len(tables) > 8 else "")
            raise ForeignDatabaseError(f"{self.path} is another program's SQLite database (tables: {shown}): historygraph keeps "
                                       f"its sessions in a file of its own, so give --store (or HISTORYGRAPH_DB) a new file; "
                                       f"the file was left as it was")
        if {"sessions", "events"} <= tables:
            # ours (any version), or another program's tables of those names
            refuse_foreign_columns({t: [r[1] for r in self._db.execute(f"PRAGMA table_info({t})")] for t in OWN_COLUMNS},
                                   str(self.path))
        if version is not None:
            pending(MIGRATIONS, version[0], str(self.path))  # a newer schema: SchemaVersionError, nothing written

    def _migrate(self) -> int:
        """Bring the file to :data:`SCHEMA_VERSION` in one transaction; returns the version."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(VERSION_TABLE)
                row = self._db.execute("SELECT version FROM schema_version").fetchone()
                current = row[0] if row else 0
                steps = pending(MIGRATIONS, current, str(self.path))
                for step in steps:
                    for statement in step.statements():
                        self._db.execute(statement)
                new = steps[-1].version if steps else current
                if new != current or row is None:
                    self._db.execute("DELETE FROM schema_version")
                    self._db.execute("INSERT INTO schema_version VALUES (?)", (new,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return new

    def _insert_session(self, session_id: str, meta: dict[str, Any], base: tuple[str, int] | None = None) -> bool:
        with self._write_transaction(session_id):  # ON CONFLICT: another instance creating it at once is not an error here
            cur = self._db.execute("INSERT INTO sessions VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING",
                                   (session_id, time.time(), json.dumps(meta)))
            inserted = cur.rowcount == 1
            if inserted and base is not None:
                self._db.execute("INSERT INTO bases VALUES (?, ?, ?)", (session_id, *base))
            return inserted

    def _read_base(self, session_id: str) -> tuple[str, int] | None:
        with self._lock:
            row = self._db.execute("SELECT parent, shared FROM bases WHERE session_id = ?", (session_id,)).fetchone()
        return (row[0], row[1]) if row else None

    def _session_meta(self, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT meta FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return json.loads(row[0]) if row else None

    @contextmanager
    def _write_transaction(self, session_id: str) -> Iterator[None]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            try:
                self._db.execute("COMMIT")
            except BaseException:  # a COMMIT that failed (a full disk) may leave the transaction open
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _write_events(self, session_id: str, start: int, messages: Sequence[Message]) -> None:
        """Called inside :meth:`_write_transaction`. Raises :class:`StaleGraph` when a position is
        already stored (the primary key; :attr:`checks_start`)."""
        rows = [(session_id, start + i, json.dumps(m.to_dict(), ensure_ascii=False)) for i, m in enumerate(messages)]
        with self._lock:
            try:
                self._db.executemany("INSERT INTO events VALUES (?, ?, ?)", rows)
            except sqlite3.IntegrityError as exc:
                raise StaleGraph(session_id) from exc

    def _read_append_key(self, session_id: str, key: str) -> tuple[str, int, int] | None:
        with self._lock:
            row = self._db.execute("SELECT fingerprint, start_position, event_count FROM append_keys "
                                   "WHERE session_id = ? AND key = ?", (session_id, key)).fetchone()
        return tuple(row) if row else None

    def _write_append_key(self, session_id: str, key: str, fingerprint: str, start: int, count: int) -> None:
        """Called inside :meth:`_write_transaction`."""
        with self._lock:
            self._db.execute("INSERT INTO append_keys (session_id, key, fingerprint, start_position, event_count) "
                             "VALUES (?, ?, ?, ?, ?)", (session_id, key, fingerprint, start, count))
            self._db.execute("DELETE FROM append_keys WHERE session_id = ? AND id <= (SELECT id FROM append_keys "
                             "WHERE session_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)", (session_id, session_id, self.kept_keys))

    def _read_derived(self, session_id: str) -> list[Row]:
        with self._lock:
            return self._db.execute("SELECT kind, version, position, data FROM derived WHERE session_id = ?",
                                    (session_id,)).fetchall()

    def _write_derived(self, session_id: str, rows: Sequence[Row], stale: Sequence[tuple[str, str]]) -> None:
        """Called inside :meth:`_write_transaction`."""
        with self._lock:
            self._db.executemany("DELETE FROM derived WHERE session_id = ? AND kind = ? AND version <> ?",
                                 [(session_id, kind, version) for kind, version in stale])
            self._db.executemany("INSERT OR REPLACE INTO derived VALUES (?, ?, ?, ?, ?)",
                                 [(session_id, kind, position, version, data) for kind, version, position, data in rows])

    def _read_pins(self, session_id: str) -> list[int]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT position FROM pins WHERE session_id = ?", (session_id,))]

    def _write_pin(self, session_id: str, position: int, pinned: bool) -> None:
        """Called inside :meth:`_write_transaction`."""
        with self._lock:
            if pinned:
                self._db.execute("INSERT OR IGNORE INTO pins VALUES (?, ?, ?)", (session_id, position, time.time()))
            else:
                self._db.execute("DELETE FROM pins WHERE session_id = ? AND position = ?", (session_id, position))
    def _read_omitted(self, session_id: str) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT data FROM omitted WHERE session_id = ? ORDER BY id", (session_id,))]

    def _write_omitted(self, session_id: str, records: Sequence[str]) -> None:
        """Called inside :meth:`_write_transaction`."""
        with self._lock:
            self._db.executemany("INSERT INTO omitted (session_id, data) VALUES (?, ?)", [(session_id, r) for r in records])

    def _event_count(self, session_id: str) -> int:
        with self._lock:
            # positions are 0..n−1, so n is max + 1: one primary-key lookup, not a count over n rows
            return self._db.execute("SELECT coalesce(max(position) + 1, 0) FROM events WHERE session_id = ?",
                                    (session_id,)).fetchone()[0]

    def _read_events_from(self, session_id: str, start: int, stop: int | None = None) -> list[Message]:
        with self._lock:
            rows = self._db.execute("SELECT data FROM events WHERE session_id = ? AND position >= ? AND position < ? "
                                    "ORDER BY position", (session_id, start, (1 << 62) if stop is None else stop)).fetchall()
        return [Message.from_openai(loads(r[0])) for r in rows]

    def sessions(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT id FROM sessions ORDER BY created, rowid")]

    def sessions_with_prefix(self, prefix: str) -> list[str]:
        with self._lock:  # a range on the primary key: ids p... sort between p and p + U+10FFFF
            return [r[0] for r in self._db.execute("SELECT id FROM sessions WHERE id >= ? AND id < ? ORDER BY created, rowid",
                                                   (prefix, prefix + "\U0010ffff"))]

    def session_infos(self) -> list[SessionInfo]:
        q = ("SELECT s.id, s.meta, count(e.position), coalesce(sum(json_extract(e.data, '$.role') = 'tool'), 0), "
             "b.parent, b.shared FROM sessions s LEFT JOIN events e ON e.session_id = s.id "
             "LEFT JOIN bases b ON b.session_id = s.id GROUP BY s.id ORDER BY s.created, s.rowid")
        with self._lock:
            rows = self._db.execute(q).fetchall()
        return self._with_bases([(sid, n, t, json.loads(meta), parent, k) for sid, meta, n, t, parent, k in rows])

    def get_embeddings(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        keys = list(keys)
        with self._lock:
            for i in range(0, len(keys), 500):
                chunk = keys[i:i + 500]
                q = f"SELECT key, vector FROM embeddings WHERE key IN ({','.join('?' * len(chunk))})"
                for k, blob in self._db.execute(q, chunk):
                    out[k] = np.frombuffer(blob, dtype=np.float32)
        return out

    def put_embeddings(self, items: dict[str, np.ndarray]) -> None:
        rows = [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items.items()]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR IGNORE INTO embeddings VALUES (?, ?)", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def get_text(self, kind: str, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM texts WHERE kind = ? AND key = ?", (kind, key)).fetchone()
        return row[0] if row else None

    def put_text(self, kind: str, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO texts VALUES (?, ?, ?)", (kind, key, value))

    def _read_policy_state(self, session_id: str, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM policy_state WHERE session_id = ? AND key = ?", (session_id, key)).fetchone()
        return row[0] if row else None

    def _write_policy_state(self, session_id: str, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO policy_state VALUES (?, ?, ?)", (session_id, key, value))

    def close(self) -> None:
        try:
            super().close()
        finally:
            with self._lock:
                self._db.close()
