"""Sessions created on a base share their parent's leading events instead of copying them
(historygraph.store.base, "Shared prefixes"; issue 50): the contract over every store, and
migration 6, which makes the branches of a store written before it share their prefix."""

from __future__ import annotations

import json
import sqlite3

import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.store import SQLiteStore, StoreError
from historygraph.store import sqlite as sqlite_mod
from test_store import make_store, pg_dsn, shared_db  # noqa: F401 (fixtures)

CALL = Message("assistant", "", (ToolCall("c1", "bash", '{"command": "ls"}'),))
EVENTS = [Message("system", "sys"), Message("user", "task"), CALL, Message("tool", "a.txt", tool_call_id="c1"),
          Message("assistant", "done")]


def test_a_session_on_a_base_reads_the_parents_prefix_and_stores_only_its_own(make_store):  # noqa: F811
    s = make_store()
    s.create_session("p")
    s.append("p", EVENTS)
    s.create_session("b", {"parent": "p"}, base=("p", 4))
    assert s.messages("b") == EVENTS[:4] and len(s.graph("b")) == 4
    assert s.append("b", Message("assistant", "other end")) == [4]  # after the shared prefix
    s.create_session("c", base=("b", 5))  # a base of a base
    assert s.append("c", [Message("user", "more")], expected_length=5) == [5]
    s.append("p", Message("user", "the parent goes on"))  # changes none of its first 4 events
    assert s.messages("b") == EVENTS[:4] + [Message("assistant", "other end")]
    assert s.messages("c") == EVENTS[:4] + [Message("assistant", "other end"), Message("user", "more")]
    assert s.graph("c").result_by_id("c1").content == "a.txt"
    infos = {i.id: i for i in s.session_infos()}
    assert [(infos[k].events, infos[k].tool_results, infos[k].shared) for k in "pbc"] == [(6, 1, 0), (5, 1, 4), (6, 1, 5)]
    s.create_session("empty", base=("p", 0))
    assert s.messages("empty") == [] and s.append("empty", EVENTS[:2]) == [0, 1]


def test_a_base_is_checked_before_the_session_is_created(make_store):  # noqa: F811
    s = make_store()
    s.create_session("p")
    s.append("p", EVENTS[:2])
    with pytest.raises(StoreError, match="no session 'nope'"):
        s.create_session("b", base=("nope", 0))
    for k in (3, -1, True):
        with pytest.raises(ValueError, match="holds 2 events, so k must be an integer from 0 to 2"):
            s.create_session("b", base=("p", k))
    assert s.sessions() == ["p"]


def test_a_second_instance_reads_a_based_session_the_same(shared_db):  # noqa: F811
    from historygraph.store import open_store

    one, two = open_store(shared_db), open_store(shared_db)
    one.create_session("p")
    one.append("p", EVENTS)
    one.create_session("b", base=("p", 3))
    one.append("b", Message("tool", "b.txt", tool_call_id="c1"))
    assert two.messages("b") == EVENTS[:3] + [Message("tool", "b.txt", tool_call_id="c1")]
    assert two.append("b", Message("assistant", "ok"), expected_length=4) == [4]
    assert one.graph("b").messages[-1].content == "ok"  # caught up with the other instance's append
    one.close(), two.close()


def _rows(m: Message) -> str:
    return json.dumps(m.to_dict(), ensure_ascii=False)


# A store of schema version 5, whose branches hold copies of their parents' events (as the router
# stored them before bases): (session, meta, events as stored JSON).
TASK, A, MORE = Message("user", "task"), Message("assistant", "a"), Message("user", "more")
BEFORE = [
    ("r", {}, [_rows(m) for m in (TASK, A, MORE, Message("assistant", "b"))]),
    # shares positions 0–2 with r (its meta says so, and they are equal): 2 rows of its own are left
    ("r~1", {"parent": "r", "forked_at": 3}, [_rows(m) for m in (TASK, A, MORE, Message("user", "x"), Message("assistant", "y"))]),
    # a branch of r~1 at 4: reads 0–2 from r through r~1, 3 from r~1; 1 row of its own
    ("r~2", {"parent": "r~1", "forked_at": 4}, [_rows(m) for m in (TASK, A, MORE, Message("user", "x"), Message("user", "z"))]),
    # position 1 is the same message in other bytes (keys in another order): only position 0 is shared
    ("r~3", {"parent": "r", "forked_at": 2}, [_rows(TASK), '{"content": "a", "role": "assistant"}', _rows(Message("user", "m2"))]),
    # a forked_at that is no integer, or a parent created after the session: left as they are
    ("q", {"parent": "r", "forked_at": "2"}, [_rows(m) for m in (TASK, A, Message("user", "q"))]),
    ("z~1", {"parent": "z", "forked_at": 1}, [_rows(TASK), _rows(Message("user", "z1"))]),
    ("z", {}, [_rows(TASK)]),
]
ROWS_AFTER = {"r": 4, "r~1": 2, "r~2": 1, "r~3": 2, "q": 3, "z~1": 2, "z": 1}  # 15 rows of 24


def _check_migrated(store, count_rows) -> None:
    for sid, _, rows in BEFORE:
        assert store.messages(sid) == [Message.from_openai(json.loads(r)) for r in rows], sid
    assert {sid: count_rows(sid) for sid, _, _ in BEFORE} == ROWS_AFTER
    assert {i.id: i.shared for i in store.session_infos()} == {"r": 0, "r~1": 3, "r~2": 4, "r~3": 1, "q": 0, "z~1": 0, "z": 0}
    assert store.append("r~2", Message("assistant", "on")) == [5]


def test_migration_6_makes_stored_branches_share_their_parents_events(tmp_path):
    path = tmp_path / "v5.sqlite"
    db = sqlite3.connect(path)
    for step in sqlite_mod.MIGRATIONS[:5]:
        for statement in step.statements():
            db.execute(statement)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    db.execute("INSERT INTO schema_version VALUES (5)")
    for n, (sid, meta, rows) in enumerate(BEFORE):
        db.execute("INSERT INTO sessions VALUES (?, ?, ?)", (sid, n, json.dumps(meta)))
        db.executemany("INSERT INTO events VALUES (?, ?, ?)", [(sid, p, r) for p, r in enumerate(rows)])
    db.commit()
    db.close()
    store = SQLiteStore(path)
    assert store.schema_version == 7

    def count_rows(sid: str) -> int:
        with sqlite3.connect(path) as c:
            return c.execute("SELECT count(*) FROM events WHERE session_id = ?", (sid,)).fetchone()[0]

    _check_migrated(store, count_rows)
    store.close()


def test_postgres_migration_6_makes_stored_branches_share_their_parents_events(pg_dsn):  # noqa: F811
    import psycopg

    from historygraph.store.postgres import MIGRATIONS, PostgresStore

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for step in MIGRATIONS[:5]:
            c.execute(step.sql)
        c.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        c.execute("INSERT INTO schema_version VALUES (5)")
        for n, (sid, meta, rows) in enumerate(BEFORE):
            c.execute("INSERT INTO sessions (id, created, meta) VALUES (%s, %s, %s)", (sid, n, json.dumps(meta)))
            for p, r in enumerate(rows):
                c.execute("INSERT INTO events VALUES (%s, %s, %s)", (sid, p, r))
    store = PostgresStore(pg_dsn)
    assert store.schema_version == 7

    def count_rows(sid: str) -> int:
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            return c.execute("SELECT count(*) FROM events WHERE session_id = %s", (sid,)).fetchone()[0]

    _check_migrated(store, count_rows)
    store.close()
