"""Schema versions and forward migrations: stores written before this release open, migrated,
with everything they held; a newer store is refused; a failing step changes nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from historygraph.history.events import Message
from historygraph.store import ForeignDatabaseError, SchemaVersionError, SQLiteStore
from historygraph.store import sqlite as sqlite_mod
from historygraph.store.migrations import Migration
from test_store import pg_dsn  # noqa: F401 (fixture)

DUMP = Path(__file__).parent / "data" / "store-schema-2.sql"


def version_of(path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT version FROM schema_version").fetchall()


def test_a_store_written_before_versions_opens_with_everything_it_held(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(DUMP.read_text())
    s = SQLiteStore(path)
    assert s.schema_version == sqlite_mod.SCHEMA_VERSION == 7 and version_of(path) == [(7,)]
    assert s.sessions() == ["run-1", "run-1~1"]
    assert s.session_meta("run-1~1") == {"parent": "run-1", "forked_at": 1}
    g = s.graph("run-1")
    assert [m.role for m in g.messages] == ["user", "assistant", "tool"]
    assert g.result_by_id("c1").content == "FAILED test_x" and g.messages[1].tool_calls[0].arguments == '{"cmd": "pytest"}'
    assert np.array_equal(s.get_embeddings(["h1"])["h1"], np.arange(4, dtype=np.float32))
    assert s.get_text("summary", "k") == "a summary"
    # the idempotency key stored before the upgrade still answers a retry, storing nothing again
    again = [Message("user", "find the bug"), g.messages[1], g.messages[2]]
    assert s.append("run-1", again, idempotency_key="k1") == [0, 1, 2]
    assert len(s.messages("run-1")) == 3
    s.append("run-1", Message("user", "next"))
    s.close()
    s = SQLiteStore(path)  # opening again migrates nothing and keeps the version
    assert s.schema_version == 7 and version_of(path) == [(7,)] and len(s.messages("run-1")) == 4
    s.close()


def test_a_version_1_store_gains_the_append_keys_table(tmp_path):
    path = tmp_path / "v1.sqlite"
    with sqlite3.connect(path) as db:
        for statement in sqlite_mod.MIGRATIONS[0].statements():
            db.execute(statement)
        db.execute("INSERT INTO sessions VALUES ('s', 0, '{}')")
        db.execute("""INSERT INTO events VALUES ('s', 0, '{"role": "user", "content": "hi"}')""")
    s = SQLiteStore(path)
    assert s.schema_version == 7 and s.messages("s")[0].content == "hi"
    assert s.append("s", Message("assistant", "hello"), idempotency_key="t1") == [1]
    assert s.append("s", Message("assistant", "hello"), idempotency_key="t1") == [1]
    s.close()


def sqlite_at_version(path, version: int) -> sqlite3.Connection:
    """A connection to a new SQLite file holding the schema of an earlier release: the first
    ``version`` migrations and their schema version (use it as ``with``, then close it)."""
    db = sqlite3.connect(path)
    for step in sqlite_mod.MIGRATIONS[:version]:
        for statement in step.statements():
            db.execute(statement)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    db.execute("INSERT INTO schema_version VALUES (?)", (version,))
    return db


def test_a_version_3_store_gains_pins_and_keeps_its_sessions(tmp_path):
    """Issue 40: a store of the release before pins (version 3) opens at the current version (7: pins, omission records, bases, policy state) with its events
    and derived rows as they were and no pin; a pin then survives reopening."""
    path = tmp_path / "v3.sqlite"
    with sqlite_at_version(path, 3) as db:
        db.execute("INSERT INTO sessions VALUES ('s', 0, '{}')")
        db.execute("""INSERT INTO events VALUES ('s', 0, '{"role": "user", "content": "hi"}')""")
        db.execute("INSERT INTO derived VALUES ('s', 'k', 0, 'v1', '[1]')")
    db.close()
    s = SQLiteStore(path)
    assert s.schema_version == 7 and version_of(path) == [(7,)]
    assert s.messages("s") == [Message("user", "hi")] and s.pins("s") == [] and s.graph("s").pins == frozenset()
    assert s.pin("s", "#0") == 0
    s.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT kind, position, version, data FROM derived").fetchall() == [("k", 0, "v1", "[1]")]
    db.close()
    s = SQLiteStore(path)
    assert s.pins("s") == [0] and s.graph("s").pins == {0}
    s.close()


def test_a_new_store_starts_at_the_current_version(tmp_path):
    s = SQLiteStore(tmp_path / "new.sqlite")
    assert s.schema_version == sqlite_mod.SCHEMA_VERSION and version_of(tmp_path / "new.sqlite") == [(7,)]
    s.close()


def test_a_store_from_a_newer_release_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "future.sqlite"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(SchemaVersionError, match=r"schema version 99, newer than the 7 this historygraph supports"):
        SQLiteStore(path)
    assert version_of(path) == [(99,)]


def test_a_failing_step_rolls_the_whole_upgrade_back(tmp_path, monkeypatch):
    path = tmp_path / "s.sqlite"
    SQLiteStore(path).close()
    bad = Migration(8, "a step whose second statement fails", "CREATE TABLE extra (x INTEGER); CREATE TABLE broken (")
    monkeypatch.setattr(sqlite_mod, "MIGRATIONS", (*sqlite_mod.MIGRATIONS, bad))
    with pytest.raises(sqlite3.OperationalError):
        SQLiteStore(path)
    with sqlite3.connect(path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "extra" not in tables and version_of(path) == [(7,)]
    good = Migration(8, "a column", "ALTER TABLE texts ADD COLUMN note TEXT")
    monkeypatch.setattr(sqlite_mod, "MIGRATIONS", (*sqlite_mod.MIGRATIONS[:7], good))
    s = SQLiteStore(path)
    assert s.schema_version == 8 and version_of(path) == [(8,)]
    s.close()


def test_postgres_store_written_before_versions_is_migrated(pg_dsn):  # noqa: F811
    import psycopg

    from historygraph.store.postgres import MIGRATIONS, SCHEMA_VERSION, PostgresStore

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(MIGRATIONS[0].sql)  # a database of the first schema, before versions and append_keys
        c.execute("INSERT INTO sessions (id, created, meta) VALUES ('s', 0, '{}')")
        c.execute("""INSERT INTO events VALUES ('s', 0, '{"role": "user", "content": "hi"}')""")
    s = PostgresStore(pg_dsn)
    assert s.schema_version == SCHEMA_VERSION == 7 and s.messages("s")[0].content == "hi"
    assert s.append("s", Message("assistant", "hello"), idempotency_key="t1") == [1]
    assert s.append("s", Message("assistant", "hello"), idempotency_key="t1") == [1]
    s.close()
    assert PostgresStore(pg_dsn).schema_version == 7
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        assert c.execute("SELECT version FROM schema_version").fetchall() == [(7,)]
        c.execute("UPDATE schema_version SET version = 8")
    with pytest.raises(SchemaVersionError, match="schema version 8"):
        PostgresStore(pg_dsn)


def _file_state(path):
    return path.read_bytes(), sorted(p.name for p in path.parent.iterdir())


def test_another_programs_database_is_refused_and_left_byte_for_byte(tmp_path):
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as db:  # another program's file, in the default rollback journal
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO users VALUES (1, 'ada')")
    db.close()
    before = _file_state(path)
    with pytest.raises(ForeignDatabaseError, match=r"app.sqlite is another program's SQLite database \(tables: users\)"):
        SQLiteStore(path)
    assert _file_state(path) == before  # no tables added, no -wal / -shm file
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    db.close()


def test_another_programs_tables_named_sessions_and_events_are_refused_and_left_byte_for_byte(tmp_path):
    """Issue 50: such a file was taken over (seven tables added), then every request failed with
    500 (``no such column: meta``); ``serve --store`` and ``open_store`` both open it this way."""
    from historygraph.store import open_store

    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, payload TEXT)")
        db.execute("CREATE TABLE sessions (name TEXT)")
        db.execute("INSERT INTO events VALUES (1, 'clicked')")
    db.close()
    before = _file_state(path)
    for opener in (SQLiteStore, open_store):
        with pytest.raises(ForeignDatabaseError, match=r"app.sqlite is not a historygraph store: its tables sessions\(name\), "
                                                       r"events\(id, payload\) are not historygraph's sessions\(id, created, meta\)"):
            opener(str(path))
    assert _file_state(path) == before  # no tables added, no -wal / -shm file
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    db.close()


def test_postgres_refuses_another_programs_tables_named_sessions_and_events(pg_dsn):  # noqa: F811
    import psycopg

    from historygraph.store.postgres import PostgresStore

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, payload TEXT)")
        c.execute("CREATE TABLE sessions (name TEXT)")
    with pytest.raises(ForeignDatabaseError, match=r"is not a historygraph store: its tables sessions\(name\), events\(id, payload\)"):
        PostgresStore(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as c:  # nothing added
        assert sorted(r[0] for r in c.execute("SELECT table_name FROM information_schema.tables "
                                              "WHERE table_schema = current_schema()")) == ["events", "sessions"]


def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    before = _file_state(path)
    with pytest.raises(ForeignDatabaseError, match="is not a SQLite database"):
        SQLiteStore(path)
    assert _file_state(path) == before


def test_a_newer_store_is_refused_before_its_journal_mode_changes(tmp_path):
    path = tmp_path / "future.sqlite"
    with sqlite3.connect(path) as db:  # a newer release's store in rollback-journal mode
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        db.execute("INSERT INTO schema_version VALUES (99)")
    db.close()
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        SQLiteStore(path)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    db.close()


def test_a_version_5_store_gains_an_empty_policy_state_table_and_keeps_its_sessions(tmp_path):
    """Issue 49: a store of the release before the cache-stable state was kept in the store
    (version 5) opens at version 7 (bases, then policy state) with its events, pins and omission records as they were and no
    policy state; a state written then survives reopening and is replaced, not added to."""
    path = tmp_path / "v5.sqlite"
    with sqlite_at_version(path, 5) as db:
        db.execute("INSERT INTO sessions VALUES ('s', 0, '{}')")
        db.execute("""INSERT INTO events VALUES ('s', 0, '{"role": "user", "content": "hi"}')""")
        db.execute("INSERT INTO pins VALUES ('s', 0, 0)")
        db.execute("""INSERT INTO omitted (session_id, data) VALUES ('s', '{"events": 1}')""")
    db.close()
    s = SQLiteStore(path)
    assert s.schema_version == 7 and version_of(path) == [(7,)]
    assert s.messages("s") == [Message("user", "hi")] and s.pins("s") == [0] and s.omitted("s") == [{"events": 1}]
    assert s.policy_state("s", "cache-stable:learned-stable") is None
    s.put_policy_state("s", "k", "one")
    s.put_policy_state("s", "k", "two")
    s.close()
    s = SQLiteStore(path)
    assert s.policy_state("s", "k") == "two" and s.policy_state("s", "other") is None
    s.close()
