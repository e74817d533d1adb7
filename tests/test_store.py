"""One contract, run over every store.

PostgreSQL runs when ``HISTORYGRAPH_TEST_POSTGRES`` holds a DSN of a server the tests may write
to (``.ci/run`` starts a throwaway one); each test gets a fresh schema there.
"""

import os
import threading
import uuid
from urllib.parse import quote

import numpy as np
import pytest

from historygraph.events import Message, ToolCall
from historygraph.graph import GraphError
from historygraph.store import MemoryStore, SQLiteStore, StoreError, open_store

PG_DSN = os.environ.get("HISTORYGRAPH_TEST_POSTGRES")


@pytest.fixture
def pg_dsn():
    """A DSN whose search_path is a fresh schema, dropped afterwards."""
    if not PG_DSN:
        pytest.skip("PostgreSQL tests need HISTORYGRAPH_TEST_POSTGRES=<dsn> (.ci/run starts a throwaway server)")
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_DSN, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    yield PG_DSN + ("&" if "?" in PG_DSN else "?") + "options=" + quote(f"-c search_path={schema}")
    with psycopg.connect(PG_DSN, autocommit=True) as c:
        c.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request, tmp_path):
    if request.param == "postgres":
        from historygraph.store.postgres import PostgresStore

        dsn = request.getfixturevalue("pg_dsn")
        return lambda: PostgresStore(dsn)
    def make():
        return MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "db" / "hg.sqlite")
    return make


@pytest.fixture(params=["sqlite", "postgres"])
def shared_db(request, tmp_path):
    """A database URL that several store instances can open."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_dsn")
    return str(tmp_path / "shared.sqlite")


EVENTS = [
    Message("system", "sys"),
    Message("user", "héllo ✓", timestamp=1700000000.5),
    Message("assistant", "", (ToolCall("c1", "bash", '{"command": "ls"}'), ToolCall("c2", "bash", "not json"))),
    Message("tool", "a.txt", tool_call_id="c1", name="bash"),
    Message("tool", "", tool_call_id="c2"),
]


def test_append_and_read_back_exactly(make_store):
    s = make_store()
    s.create_session("s1", {"source": "test"})
    assert s.append("s1", EVENTS) == [0, 1, 2, 3, 4]
    assert s.messages("s1") == EVENTS
    assert s.session_meta("s1") == {"source": "test"}
    assert s.sessions() == ["s1"]
    assert s.graph("s1").result_by_id("c1").content == "a.txt"


def test_invalid_batch_writes_nothing(make_store):
    s = make_store()
    s.create_session("s1")
    s.append("s1", EVENTS[:3])
    bad = [Message("tool", "ok", tool_call_id="c1"), Message("tool", "?", tool_call_id="nope")]
    with pytest.raises(GraphError, match="nope"):
        s.append("s1", bad)
    assert s.messages("s1") == EVENTS[:3]
    with pytest.raises(GraphError, match="c1"):
        s.append("s1", [Message("assistant", "", (ToolCall("c1", "x"),))])  # duplicate call id
    assert len(s.messages("s1")) == 3


def test_unknown_and_duplicate_sessions_are_named(make_store):
    s = make_store()
    with pytest.raises(StoreError, match="ghost"):
        s.messages("ghost")
    s.create_session("s1")
    with pytest.raises(StoreError, match="s1"):
        s.create_session("s1")


def test_embedding_cache_round_trip(make_store):
    s = make_store()
    v = np.arange(4, dtype=np.float32)
    s.put_embeddings({"k": v})
    got = s.get_embeddings(["k", "missing"])
    assert list(got) == ["k"] and np.array_equal(got["k"], v)


def test_failed_embedding_batch_stores_nothing_and_the_store_keeps_working(make_store):
    s = make_store()
    v = np.arange(4, dtype=np.float32)
    with pytest.raises(ValueError):
        s.put_embeddings({"a": v, "b": np.array(["not a number"])})
    assert s.get_embeddings(["a", "b"]) == {}
    s.put_embeddings({"c": v})
    assert np.array_equal(s.get_embeddings(["c"])["c"], v)


def test_sqlite_embedding_batch_failing_inside_the_transaction_rolls_back(tmp_path):
    s = SQLiteStore(tmp_path / "hg.sqlite")
    v = np.arange(4, dtype=np.float32)
    with pytest.raises(Exception):  # sqlite3 cannot bind an object as a key: fails after the first row
        s.put_embeddings({"a": v, object(): v})
    assert s.get_embeddings(["a"]) == {}
    s.put_embeddings({"c": v})  # before the fix: "cannot start a transaction within a transaction"
    other = SQLiteStore(tmp_path / "hg.sqlite")  # and the write lock was released
    other.put_embeddings({"d": v})
    assert set(s.get_embeddings(["c", "d"])) == {"c", "d"}


def test_sqlite_reopen_gives_back_what_was_stored(tmp_path):
    path = tmp_path / "hg.sqlite"
    s = SQLiteStore(path)
    s.create_session("s1", {"k": 1})
    s.append("s1", EVENTS)
    s.close()
    again = SQLiteStore(path)
    assert again.messages("s1") == EVENTS
    assert again.session_meta("s1") == {"k": 1}
    assert again.graph("s1").turns == 1


def test_text_cache_first_writer_wins(make_store):
    s = make_store()
    assert s.get_text("summary", "k") is None
    s.put_text("summary", "k", "first")
    s.put_text("summary", "k", "second")
    assert s.get_text("summary", "k") == "first"
    assert s.get_text("other", "k") is None


def test_concurrent_appends_lose_nothing_and_keep_order(make_store):
    """20 threads on one session and 50 threads on their own sessions (issue 6, library side)."""
    from concurrent.futures import ThreadPoolExecutor

    s = make_store()
    s.create_session("shared")
    for i in range(50):
        s.create_session(f"own{i}")

    def client(k: int, session: str) -> None:
        for n in range(10):
            s.append(session, Message("user", f"client {k} event {n}"))

    with ThreadPoolExecutor(max_workers=16) as pool:
        jobs = [pool.submit(client, k, "shared") for k in range(20)] + \
               [pool.submit(client, k, f"own{k}") for k in range(50)]
        for j in jobs:
            j.result()
    shared = [m.content for m in s.messages("shared")]
    assert len(shared) == len(set(shared)) == 200
    for k in range(20):
        mine = [c for c in shared if c.startswith(f"client {k} ")]
        assert mine == [f"client {k} event {n}" for n in range(10)]
    assert all(len(s.messages(f"own{k}")) == 10 for k in range(50))


def test_two_instances_serve_one_session_consistently(shared_db, request):
    a, b = open_store(shared_db), open_store(shared_db)
    assert type(a).__name__ == {"sqlite": "SQLiteStore", "postgres": "PostgresStore"}[request.node.callspec.params["shared_db"]]
    a.create_session("s1")
    a.append("s1", EVENTS[:3])  # both instances cache the graph now
    assert b.graph("s1").turns == 1 and len(a.graph("s1")) == 3
    b.append("s1", EVENTS[3:])  # b appends the results of a's call
    assert a.messages("s1") == EVENTS
    assert len(a.graph("s1")) == 5 and a.graph("s1").result_by_id("c2").content == ""
    with pytest.raises(GraphError, match="c1"):  # a validates against what b wrote
        a.append("s1", [Message("tool", "again", tool_call_id="c1")])
    assert b.sessions() == ["s1"] and len(b.messages("s1")) == 5
    a.close(), b.close()


def test_concurrent_appends_from_two_instances_all_land_in_order(shared_db):
    a, b = open_store(shared_db), open_store(shared_db)
    a.create_session("s1")

    def writer(store, tag):
        for i in range(15):
            store.append("s1", Message("user", f"{tag}{i}"))

    threads = [threading.Thread(target=writer, args=(s, t)) for s, t in ((a, "a"), (b, "b"))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    got = [m.content for m in a.messages("s1")]
    assert sorted(got) == sorted([f"a{i}" for i in range(15)] + [f"b{i}" for i in range(15)])
    assert [x for x in got if x[0] == "a"] == [f"a{i}" for i in range(15)]  # each writer's order kept
    assert [m.content for m in b.graph("s1").messages] == got == [m.content for m in a.graph("s1").messages]
    a.close(), b.close()


def test_sessions_with_prefix(make_store):
    s = make_store()
    for sid in ["a", "a~1", "ab", "a~2", "b~1", "a~1~x", "a%~", "a_~"]:
        s.create_session(sid)
    assert s.sessions_with_prefix("a~") == ["a~1", "a~2", "a~1~x"]
    assert s.sessions_with_prefix("a%") == ["a%~"] and s.sessions_with_prefix("zz") == []


def test_postgres_connection_of_an_ended_thread_is_closed(pg_dsn):
    import gc

    from historygraph.store.postgres import PostgresStore

    s = PostgresStore(pg_dsn)
    seen = []
    t = threading.Thread(target=lambda: seen.append((s.sessions(), s._db)))
    t.start(), t.join()
    conn = seen[0][1]
    assert not conn.closed
    del t
    gc.collect()
    assert conn.closed and not s._db.closed  # this thread's own connection is unaffected
    s.close()


def test_session_infos_count_events_and_tool_results_without_graphs(make_store):
    s = make_store()
    s.create_session("one", {"parent": "zero"})
    s.create_session("empty")
    s.append("one", EVENTS + [Message("user", "nul \x00 inside"),
                              Message("assistant", "", (ToolCall("c3", "bash", "{}"),)),
                              Message("tool", '{"role": "tool"} \x00', tool_call_id="c3")])
    infos = s.session_infos()
    assert [(i.id, i.events, i.tool_results, i.meta) for i in infos] == [
        ("one", 8, 3, {"parent": "zero"}), ("empty", 0, 0, {})]
