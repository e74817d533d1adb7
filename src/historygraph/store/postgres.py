"""PostgreSQL store (psycopg 3), for several proxy instances sharing one database.

Same contract and schema as :class:`~historygraph.store.sqlite.SQLiteStore` (including
``append_keys``, :data:`APPEND_KEYS_TABLE`, ``derived``, :data:`DERIVED_TABLE`, ``pins``, :data:`PINS_TABLE`, ``omitted``,
:data:`OMITTED_TABLE`, ``bases``, :data:`BASES_TABLE`, ``policy_state``, :data:`POLICY_STATE_TABLE`, and the versioned forward migrations, :data:`MIGRATIONS`; events stored as the
JSON text of :meth:`Message.to_dict`, embeddings as float32 bytes), plus a ``seq`` column that
orders sessions by creation across instances.

Consistency between instances: an append locks the session's row (``SELECT … FOR UPDATE``) in
its transaction, re-reads the stored length there and writes after it; the primary key
``(session_id, position)`` rejects any write that would still collide. A graph cached by one
instance is caught up with what others appended whenever it is handed out (see
:mod:`historygraph.store.base`).

Connections: one per thread that uses the store (opened on first use, closed when the thread
object is collected after it ends, or by :meth:`PostgresStore.close`), so requests of different sessions do not wait for each other's
round trips and commits; the proxy's worker pool (40 threads) bounds their number.

Args of :class:`PostgresStore`: ``dsn``, a libpq connection string or ``postgresql://`` URL.
Raises ``psycopg.OperationalError`` when the server cannot be reached.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

from historygraph.history.derived import Row, loads
from historygraph.history.events import Message
from historygraph.store.base import SessionInfo, Store
from historygraph.store.migrations import VERSION_TABLE, Migration, pending, refuse_foreign_columns

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, seq BIGSERIAL, created DOUBLE PRECISION NOT NULL, meta TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL REFERENCES sessions(id), position INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (session_id, position));
CREATE TABLE IF NOT EXISTS embeddings (key TEXT PRIMARY KEY, vector BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS texts (kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (kind, key));
"""

APPEND_KEYS_TABLE = """
CREATE TABLE IF NOT EXISTS append_keys (
    id BIGSERIAL PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), key TEXT NOT NULL,
    fingerprint TEXT NOT NULL, start_position INTEGER NOT NULL, event_count INTEGER NOT NULL, UNIQUE (session_id, key));
CREATE INDEX IF NOT EXISTS append_keys_order ON append_keys (session_id, id);
"""
"""Added by issue 17 (idempotency keys, :meth:`Store.append`): migration 2, which adds the empty
table to a database created before it and changes nothing else."""

DERIVED_TABLE = """
CREATE TABLE derived (
    session_id TEXT NOT NULL REFERENCES sessions(id), kind TEXT NOT NULL, position INTEGER NOT NULL,
    version TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (session_id, kind, position));
"""
"""Added by issue 13: migration 3, an empty table of derived rows (:mod:`historygraph.history.derived`),
as SQLite's."""

PINS_TABLE = """
CREATE TABLE pins (
    session_id TEXT NOT NULL REFERENCES sessions(id), position INTEGER NOT NULL, created DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (session_id, position));
"""
"""Added by issue 40 (pins, :meth:`Store.pin`): migration 4, an empty table of each session's pinned
positions (a row while pinned, deleted by an unpin); changes nothing else."""
OMITTED_TABLE = """
CREATE TABLE omitted (id BIGSERIAL PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), data TEXT NOT NULL);
CREATE INDEX omitted_order ON omitted (session_id, id);
"""
"""Added by issue 40: migration 5, an empty append-only table of omission records
(:mod:`historygraph.render.omissions`), as SQLite's."""

BASES_TABLE = """
CREATE TABLE bases (
    session_id TEXT PRIMARY KEY REFERENCES sessions(id), parent TEXT NOT NULL REFERENCES sessions(id),
    shared INTEGER NOT NULL);
INSERT INTO bases (session_id, parent, shared)
SELECT id, parent, shared FROM (
    SELECT s.id AS id, p.id AS parent, coalesce(
        (SELECT min(e.position) FROM events e LEFT JOIN events q ON q.session_id = p.id AND q.position = e.position
         WHERE e.session_id = s.id AND e.position < f.n AND q.data IS DISTINCT FROM e.data),
        least(f.n, (SELECT count(*) FROM events c WHERE c.session_id = s.id))) AS shared
    FROM sessions s
    CROSS JOIN LATERAL (SELECT CASE WHEN json_typeof(s.meta::json->'forked_at') = 'number'
                                         AND s.meta::json->>'forked_at' ~ '^[0-9]{1,9}$'
                                    THEN (s.meta::json->>'forked_at')::integer END AS n) f
    JOIN sessions p ON p.id = s.meta::json->>'parent' AND p.seq < s.seq
    WHERE f.n IS NOT NULL) x
WHERE shared > 0;
DELETE FROM events e USING bases b WHERE b.session_id = e.session_id AND e.position < b.shared
"""
"""Added by issue 50: migration 6, each session's base (parent and shared length), branches stored
before it made to share their parent's events, as SQLite's."""
POLICY_STATE_TABLE = """
CREATE TABLE policy_state (
    session_id TEXT NOT NULL REFERENCES sessions(id), key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (session_id, key));
"""
"""Added by issue 49: migration 7, an empty table of each session's policy state
(:meth:`Store.policy_state`), as SQLite's."""

MIGRATIONS = (
    Migration(1, "sessions, events, embeddings, texts", SCHEMA),
    Migration(2, "append_keys: idempotency keys of appends", APPEND_KEYS_TABLE),
    Migration(3, "derived: per-message derived rows of each session", DERIVED_TABLE),
    Migration(4, "pins: pinned items of each session", PINS_TABLE),
    Migration(5, "omitted: what each rendering of a session left out", OMITTED_TABLE),
    Migration(6, "bases: branches read their shared prefix from their parent", BASES_TABLE),
    Migration(7, "policy_state: what a policy keeps between renders of a session", POLICY_STATE_TABLE),
)
"""Forward migrations, in order (:mod:`historygraph.store.migrations`); the same versions as SQLite's."""
SCHEMA_VERSION = MIGRATIONS[-1].version


class PostgresStore(Store):
    def __init__(self, dsn: str) -> None:
        import psycopg  # optional dependency: the ``server`` extra

        super().__init__()
        self._connect = lambda: psycopg.connect(dsn, autocommit=True)
        self.path = _redact(dsn)
        self._local = threading.local()
        self._opened: list[Any] = []
        self._opened_lock = threading.Lock()
        self.schema_version = self._migrate()

    def _migrate(self) -> int:
        """Bring the database to :data:`SCHEMA_VERSION` in one transaction; returns the version."""
        db = self._db
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(7243)")  # concurrent first starts migrate once
            found: dict[str, list[str]] = {}
            for table, column in db.execute("SELECT table_name, column_name FROM information_schema.columns WHERE "
                                            "table_schema = current_schema() AND table_name IN ('sessions', 'events') "
                                            "ORDER BY table_name, ordinal_position"):
                found.setdefault(table, []).append(column)
            if len(found) == 2:  # ours, or another program's tables of those names: refused, nothing written
                refuse_foreign_columns(found, self.path)
            db.execute(VERSION_TABLE)
            row = db.execute("SELECT version FROM schema_version").fetchone()
            current = row[0] if row else 0
            steps = pending(MIGRATIONS, current, self.path)
            for step in steps:
                db.execute(step.sql)
            new = steps[-1].version if steps else current
            if new != current or row is None:
                db.execute("DELETE FROM schema_version")
                db.execute("INSERT INTO schema_version VALUES (%s)", (new,))
        return new

    @property
    def _db(self) -> Any:
        """This thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            weakref.finalize(threading.current_thread(), conn.close)  # the thread's end closes it
            with self._opened_lock:
                self._opened = [c for c in self._opened if not c.closed] + [conn]
        return conn

    def _insert_session(self, session_id: str, meta: dict[str, Any], base: tuple[str, int] | None = None) -> bool:
        # ON CONFLICT: another instance creating the same session at once is not an error here
        db = self._db
        with db.transaction():
            cur = db.execute("INSERT INTO sessions (id, created, meta) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                             (session_id, time.time(), json.dumps(meta)))
            inserted = cur.rowcount == 1
            if inserted and base is not None:
                db.execute("INSERT INTO bases VALUES (%s, %s, %s)", (session_id, *base))
        return inserted

    def _read_base(self, session_id: str) -> tuple[str, int] | None:
        row = self._db.execute("SELECT parent, shared FROM bases WHERE session_id = %s", (session_id,)).fetchone()
        return (row[0], row[1]) if row else None

    def _session_meta(self, session_id: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT meta FROM sessions WHERE id = %s", (session_id,)).fetchone()
        return json.loads(row[0]) if row else None

    @contextmanager
    def _write_transaction(self, session_id: str) -> Iterator[None]:
        db = self._db
        with db.transaction():
            db.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
            yield

    def _write_events(self, session_id: str, start: int, messages: Sequence[Message]) -> None:
        rows = [(session_id, start + i, json.dumps(m.to_dict(), ensure_ascii=False)) for i, m in enumerate(messages)]
        with self._db.cursor() as cur:
            cur.executemany("INSERT INTO events VALUES (%s, %s, %s)", rows)

    def _read_append_key(self, session_id: str, key: str) -> tuple[str, int, int] | None:
        row = self._db.execute("SELECT fingerprint, start_position, event_count FROM append_keys "
                               "WHERE session_id = %s AND key = %s", (session_id, key)).fetchone()
        return tuple(row) if row else None

    def _write_append_key(self, session_id: str, key: str, fingerprint: str, start: int, count: int) -> None:
        """Called inside :meth:`_write_transaction` (the session row is locked)."""
        db = self._db
        db.execute("INSERT INTO append_keys (session_id, key, fingerprint, start_position, event_count) "
                   "VALUES (%s, %s, %s, %s, %s)", (session_id, key, fingerprint, start, count))
        db.execute("DELETE FROM append_keys WHERE session_id = %s AND id <= (SELECT id FROM append_keys "
                   "WHERE session_id = %s ORDER BY id DESC OFFSET %s LIMIT 1)", (session_id, session_id, self.kept_keys))

    def _read_derived(self, session_id: str) -> list[Row]:
        return self._db.execute("SELECT kind, version, position, data FROM derived WHERE session_id = %s",
                                (session_id,)).fetchall()

    def _write_derived(self, session_id: str, rows: Sequence[Row], stale: Sequence[tuple[str, str]]) -> None:
        """Called inside :meth:`_write_transaction` (the session row is locked)."""
        with self._db.cursor() as cur:
            if stale:
                cur.executemany("DELETE FROM derived WHERE session_id = %s AND kind = %s AND version <> %s",
                                [(session_id, kind, version) for kind, version in stale])
            if rows:
                cur.executemany("INSERT INTO derived VALUES (%s, %s, %s, %s, %s) ON CONFLICT (session_id, kind, position) "
                                "DO UPDATE SET version = excluded.version, data = excluded.data",
                                [(session_id, kind, position, version, data) for kind, version, position, data in rows])

    def _read_pins(self, session_id: str) -> list[int]:
        return [r[0] for r in self._db.execute("SELECT position FROM pins WHERE session_id = %s", (session_id,)).fetchall()]

    def _write_pin(self, session_id: str, position: int, pinned: bool) -> None:
        """Called inside :meth:`_write_transaction` (the session row is locked)."""
        if pinned:
            self._db.execute("INSERT INTO pins VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", (session_id, position, time.time()))
        else:
            self._db.execute("DELETE FROM pins WHERE session_id = %s AND position = %s", (session_id, position))
    def _read_omitted(self, session_id: str) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT data FROM omitted WHERE session_id = %s ORDER BY id",
                                               (session_id,)).fetchall()]

    def _write_omitted(self, session_id: str, records: Sequence[str]) -> None:
        """Called inside :meth:`_write_transaction` (the session row is locked)."""
        with self._db.cursor() as cur:
            cur.executemany("INSERT INTO omitted (session_id, data) VALUES (%s, %s)", [(session_id, r) for r in records])

    def _event_count(self, session_id: str) -> int:
        # positions are 0..n−1, so n is max + 1: one primary-key lookup, not a count over n rows
        return self._db.execute("SELECT coalesce(max(position) + 1, 0) FROM events WHERE session_id = %s",
                                (session_id,)).fetchone()[0]

    def _read_events_from(self, session_id: str, start: int, stop: int | None = None) -> list[Message]:
        rows = self._db.execute("SELECT data FROM events WHERE session_id = %s AND position >= %s AND position < %s "
                                "ORDER BY position", (session_id, start, (1 << 31) - 1 if stop is None else stop)).fetchall()
        return [Message.from_openai(loads(r[0])) for r in rows]

    def sessions(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT id FROM sessions ORDER BY seq")]

    def sessions_with_prefix(self, prefix: str) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT id FROM sessions WHERE starts_with(id, %s) ORDER BY seq", (prefix,))]

    def session_infos(self) -> list[SessionInfo]:
        # PostgreSQL's JSON operators reject the escaped NUL a tool result may hold, so the role is
        # matched as text: every event row starts with its role (Message.to_dict puts it first).
        q = ("SELECT s.id, s.meta, count(e.position), count(*) FILTER (WHERE starts_with(e.data, '{\"role\": \"tool\"')), "
             "b.parent, b.shared FROM sessions s LEFT JOIN events e ON e.session_id = s.id "
             "LEFT JOIN bases b ON b.session_id = s.id GROUP BY s.id, s.seq, b.parent, b.shared ORDER BY s.seq")
        return self._with_bases([(sid, n, t, json.loads(meta), parent, k) for sid, meta, n, t, parent, k in self._db.execute(q).fetchall()])

    def get_embeddings(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        rows = self._db.execute("SELECT key, vector FROM embeddings WHERE key = ANY(%s)", (list(keys),)).fetchall()
        return {k: np.frombuffer(bytes(v), dtype=np.float32) for k, v in rows}

    def put_embeddings(self, items: dict[str, np.ndarray]) -> None:
        rows = [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items.items()]
        db = self._db
        with db.transaction(), db.cursor() as cur:
            cur.executemany("INSERT INTO embeddings VALUES (%s, %s) ON CONFLICT DO NOTHING", rows)

    def get_text(self, kind: str, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM texts WHERE kind = %s AND key = %s", (kind, key)).fetchone()
        return row[0] if row else None

    def put_text(self, kind: str, key: str, value: str) -> None:
        self._db.execute("INSERT INTO texts VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", (kind, key, value))

    def _read_policy_state(self, session_id: str, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM policy_state WHERE session_id = %s AND key = %s", (session_id, key)).fetchone()
        return row[0] if row else None

    def _write_policy_state(self, session_id: str, key: str, value: str) -> None:
        self._db.execute("INSERT INTO policy_state VALUES (%s, %s, %s) ON CONFLICT (session_id, key) "
                         "DO UPDATE SET value = excluded.value", (session_id, key, value))

    def close(self) -> None:
        try:
            super().close()
        finally:
            with self._opened_lock:
                for conn in self._opened:
                    conn.close()
                self._opened.clear()


def _redact(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (for messages and ``store.path``)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    if "password" in params:
        params["password"] = "***"
    return make_conninfo("", **params)
