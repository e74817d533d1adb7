"""One contract, run over every store.

PostgreSQL runs when ``HISTORYGRAPH_TEST_POSTGRES`` holds a DSN of a server the tests may write
to (``.ci/run`` starts a throwaway one); each test gets a fresh schema there.
"""

import math
import os
import threading
import uuid
from urllib.parse import quote

import numpy as np
import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import GraphError
from historygraph.store import AppendConflict, MemoryStore, SQLiteStore, StoreError, open_store

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


def test_postgres_embedding_batch_failing_inside_the_transaction_rolls_back(pg_dsn):
    from historygraph.store.postgres import PostgresStore

    s = PostgresStore(pg_dsn)
    v = np.arange(4, dtype=np.float32)
    with pytest.raises(Exception):  # PostgreSQL text cannot hold NUL: the second row fails after the first
        s.put_embeddings({"a": v, "b\x00": v})
    assert s.get_embeddings(["a"]) == {}
    s.put_embeddings({"c": v})
    assert list(s.get_embeddings(["c"])) == ["c"]


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


def test_reopened_events_read_back_what_json_dumps_wrote_even_nan_and_infinity(shared_db):
    """Stored events are read by msgspec's decoder, which refuses the NaN and Infinity that
    json.dumps writes for such a timestamp: those are read back by json.loads, equal."""
    s = open_store(shared_db)
    s.create_session("s1")
    odd = [Message("user", "t", timestamp=math.inf), Message("user", "n", timestamp=math.nan),
           Message("user", "big ✓ \u2028 \\ \"q\"", timestamp=-1e308)]
    s.append("s1", EVENTS + odd)
    s.close()
    got = open_store(shared_db).messages("s1")
    assert got[:len(EVENTS)] == EVENTS and got[-1] == odd[-1]
    assert got[5].timestamp == math.inf and math.isnan(got[6].timestamp) and got[6].content == "n"


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
        a.append("s1", [Message("assistant", "", (ToolCall("c1", "x"),))])  # c1 is taken
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


# -- retries (issue 17): idempotency keys and expected_length -----------------------------------

def test_retried_append_with_the_same_key_stores_once_and_answers_the_same(make_store):
    s = make_store()
    s.create_session("s1")
    s.append("s1", EVENTS[:1])
    first = s.append("s1", EVENTS[1:3], idempotency_key="turn-1")
    assert first == [1, 2]
    s.append("s1", EVENTS[3:], idempotency_key="turn-2")
    assert s.append("s1", EVENTS[1:3], idempotency_key="turn-1") == [1, 2]  # after later appends too
    assert s.messages("s1") == EVENTS and len(s.graph("s1")) == 5
    again = make_store()  # a fresh instance (a restarted server) answers from the stored key
    if not isinstance(s, MemoryStore):
        assert again.append("s1", EVENTS[3:], idempotency_key="turn-2") == [3, 4]
        assert again.messages("s1") == EVENTS
    s.create_session("s2")  # keys are per session
    assert s.append("s2", [Message("user", "other")], idempotency_key="turn-1") == [0]


def test_same_key_with_another_batch_is_refused_naming_the_key(make_store):
    s = make_store()
    s.create_session("s1")
    s.append("s1", [Message("user", "a")], idempotency_key="k-7")
    for batch, expected in (([Message("user", "b")], None), ([Message("user", "a")], 1),
                            ([Message("user", "a"), Message("user", "a")], None)):
        with pytest.raises(AppendConflict, match="'k-7'") as info:
            s.append("s1", batch, idempotency_key="k-7", expected_length=expected)
        assert info.value.key == "k-7" and info.value.length == 1
    assert [m.content for m in s.messages("s1")] == ["a"]


def test_expected_length_appends_only_at_that_length(make_store):
    s = make_store()
    s.create_session("s1")
    assert s.append("s1", EVENTS[:2], expected_length=0) == [0, 1]
    with pytest.raises(AppendConflict, match="has 2 events, not 1") as info:
        s.append("s1", EVENTS[2:3], expected_length=1)
    assert info.value.length == 2 and info.value.key is None
    with pytest.raises(AppendConflict, match="has 2 events, not 3"):
        s.append("s1", EVENTS[2:3], expected_length=3)
    assert s.messages("s1") == EVENTS[:2]
    # the key is checked first: a retry of a keyed append at a length it moved past is answered
    assert s.append("s1", EVENTS[2:3], expected_length=2, idempotency_key="k") == [2]
    assert s.append("s1", EVENTS[2:3], expected_length=2, idempotency_key="k") == [2]
    assert s.messages("s1") == EVENTS[:3]


def test_bad_keys_and_lengths_are_named(make_store):
    s = make_store()
    s.create_session("s1")
    for key in ("", "x" * 256, 7):
        with pytest.raises(ValueError, match="idempotency key"):
            s.append("s1", [Message("user", "a")], idempotency_key=key)
    for length in (-1, True, "0"):
        with pytest.raises(ValueError, match="expected_length"):
            s.append("s1", [Message("user", "a")], expected_length=length)
    assert s.messages("s1") == []
    assert s.append("s1", [Message("user", "a")], idempotency_key="x" * 255) == [0]


def test_a_failed_append_remembers_no_key(make_store):
    s = make_store()
    s.create_session("s1")
    bad = [Message("tool", "?", tool_call_id="nope")]
    with pytest.raises(GraphError):
        s.append("s1", bad, idempotency_key="k")
    with pytest.raises(AppendConflict):
        s.append("s1", [Message("user", "a")], idempotency_key="k", expected_length=5)
    assert s.append("s1", [Message("user", "a")], idempotency_key="k") == [0]  # the key is free: nothing was stored


def test_only_the_newest_keys_are_kept(make_store):
    s = make_store()
    s.kept_keys = 3
    s.create_session("s1")
    s.create_session("s2")
    s.append("s2", [Message("user", "s2")], idempotency_key="k0")
    for i in range(5):
        s.append("s1", [Message("user", f"e{i}")], idempotency_key=f"k{i}")
    for i in (2, 3, 4):  # the newest three: still answered from the record
        assert s.append("s1", [Message("user", f"e{i}")], idempotency_key=f"k{i}") == [i]
    assert s.append("s1", [Message("user", "e1")], idempotency_key="k1") == [5]  # forgotten: appended again
    assert s.append("s2", [Message("user", "s2")], idempotency_key="k0") == [0]  # another session's keys stay
    assert len(s.messages("s1")) == 6 and len(s.messages("s2")) == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_key_and_events_commit_together(backend, tmp_path, request):
    """A failure after the events are written and before the key is (or the other way round)
    rolls both back: a retry never finds events without their key."""
    if backend == "postgres":
        from historygraph.store.postgres import PostgresStore

        dsn = request.getfixturevalue("pg_dsn")
        make = lambda: PostgresStore(dsn)  # noqa: E731
    else:
        make = lambda: SQLiteStore(tmp_path / "hg.sqlite")  # noqa: E731
    s = make()
    s.create_session("s1")

    def broken(*args):
        raise OSError("cut")

    s._write_append_key = broken
    with pytest.raises(OSError):
        s.append("s1", [Message("user", "a")], idempotency_key="k")
    fresh = make()
    assert fresh.messages("s1") == [] and s.messages("s1") == []
    assert fresh.append("s1", [Message("user", "a")], idempotency_key="k") == [0]
    assert len(s.graph("s1")) == 1  # the failed instance's cached graph catches up


def _chain(append, length, writer: int, n: int) -> list[int]:
    """Writer ``writer`` appends ``n`` events, each naming the event it follows, at a known position
    (expected_length), retrying from the current length after a conflict."""
    got = []
    for k in range(n):
        while True:
            at = length()
            try:
                got += append(Message("user", f"w{writer}.{k} after {at - 1}"), at)
                break
            except AppendConflict:
                continue
    return got


def _check_chain(contents: list[str], writers: int, n: int) -> None:
    assert len(contents) == writers * n
    for i, c in enumerate(contents):
        assert c.endswith(f" after {i - 1}"), (i, c)  # each event landed right after the one it saw
    for w in range(writers):
        assert [c.split()[0] for c in contents if c.startswith(f"w{w}.")] == [f"w{w}.{k}" for k in range(n)]


def test_concurrent_appends_with_expected_length_keep_order(make_store):
    from concurrent.futures import ThreadPoolExecutor

    s = make_store()
    s.create_session("s1")
    with ThreadPoolExecutor(max_workers=8) as pool:
        jobs = [pool.submit(_chain, lambda m, at: s.append("s1", m, expected_length=at),
                            lambda: len(s.messages("s1")), w, 6) for w in range(8)]
        positions = sorted(p for j in jobs for p in j.result())
    assert positions == list(range(48))
    _check_chain([m.content for m in s.messages("s1")], 8, 6)


def test_concurrent_appends_with_expected_length_from_two_instances(shared_db):
    from concurrent.futures import ThreadPoolExecutor

    a, b = open_store(shared_db), open_store(shared_db)
    a.create_session("s1")
    with ThreadPoolExecutor(max_workers=4) as pool:
        jobs = [pool.submit(_chain, lambda m, at, st=st: st.append("s1", m, expected_length=at),
                            lambda st=st: len(st.messages("s1")), w, 8) for w, st in enumerate([a, b, a, b])]
        assert sorted(p for j in jobs for p in j.result()) == list(range(32))
    _check_chain([m.content for m in b.messages("s1")], 4, 8)
    assert a.graph("s1").messages == b.graph("s1").messages
    a.close(), b.close()


OLD_SQLITE_SCHEMA = """
CREATE TABLE sessions (id TEXT PRIMARY KEY, created REAL NOT NULL, meta TEXT NOT NULL);
CREATE TABLE events (
    session_id TEXT NOT NULL REFERENCES sessions(id), position INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (session_id, position));
CREATE TABLE embeddings (key TEXT PRIMARY KEY, vector BLOB NOT NULL);
CREATE TABLE texts (kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (kind, key));
INSERT INTO sessions VALUES ('old', 1700000000.0, '{"source": "before issue 17"}');
INSERT INTO events VALUES ('old', 0, '{"role": "user", "content": "stored by the old schema"}');
"""
"""A store as the code before issue 17 wrote it (its four tables and one session)."""


def test_a_sqlite_store_of_the_old_schema_opens_and_takes_keys(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SQLITE_SCHEMA)
    s = SQLiteStore(path)
    assert s.messages("old") == [Message("user", "stored by the old schema")]
    assert s.session_meta("old") == {"source": "before issue 17"}
    assert s.append("old", [Message("user", "new")], idempotency_key="k") == [1]
    assert s.append("old", [Message("user", "new")], idempotency_key="k") == [1]
    s.close()
    again = SQLiteStore(path)  # the migration is idempotent: reopening keeps keys and events
    assert again.append("old", [Message("user", "new")], idempotency_key="k") == [1]
    assert [m.content for m in again.messages("old")] == ["stored by the old schema", "new"]


def test_a_postgres_store_of_the_old_schema_opens_and_takes_keys(pg_dsn):
    import psycopg

    from historygraph.store.postgres import PostgresStore

    old = (OLD_SQLITE_SCHEMA.replace("id TEXT PRIMARY KEY, created", "id TEXT PRIMARY KEY, seq BIGSERIAL, created")
           .replace("created REAL", "created DOUBLE PRECISION").replace("BLOB", "BYTEA")
           .replace("VALUES ('old', 1700000000.0", "(id, created, meta) VALUES ('old', 1700000000.0"))
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(old)
    s = PostgresStore(pg_dsn)
    assert s.messages("old") == [Message("user", "stored by the old schema")]
    assert s.append("old", [Message("user", "new")], idempotency_key="k") == [1]
    s.close()
    again = PostgresStore(pg_dsn)
    assert again.append("old", [Message("user", "new")], idempotency_key="k") == [1]
    assert [m.content for m in again.messages("old")] == ["stored by the old schema", "new"]
    again.close()


def test_sqlite_append_reads_the_stored_length_by_key_not_by_counting(tmp_path):
    """An append checks for events another instance wrote with one primary-key lookup; a
    ``count(*)`` over the session's rows made every append O(n) (issue 13)."""
    store = SQLiteStore(tmp_path / "s.sqlite")
    store.create_session("s")
    store.append("s", [Message("user", "task")] + [Message("assistant", f"a{i}") for i in range(50)])
    seen: list[str] = []
    store._db.set_trace_callback(seen.append)
    store.append("s", Message("assistant", "one more"))
    store._db.set_trace_callback(None)
    assert not [q for q in seen if "count(" in q.lower()]
    assert len(store.graph("s")) == 52 and store._event_count("s") == 52
    other = SQLiteStore(tmp_path / "s.sqlite")  # another instance's append is still picked up
    other.append("s", Message("assistant", "from the other instance"))
    assert store.graph("s").messages[-1].content == "from the other instance"


def test_validate_checks_a_batch_against_the_graph_and_itself():
    from historygraph.history.graph import ContextGraph

    g = ContextGraph("s", [Message("user", "t"), Message("assistant", "", (ToolCall("c1", "bash", "{}"),))])
    call2 = Message("assistant", "", (ToolCall("c2", "bash", "{}"),))
    g.validate([Message("tool", "r1", tool_call_id="c1"), call2, Message("tool", "r2", tool_call_id="c2")])
    with pytest.raises(GraphError, match="event 1: tool call id 'c1' appears twice"):
        g.validate([call2, Message("assistant", "", (ToolCall("c1", "bash", "{}"),))])
    with pytest.raises(GraphError, match="event 1: tool call id 'c2' appears twice"):
        g.validate([call2, call2])
    g.validate([Message("tool", "r", tool_call_id="c1")] * 2)  # a late second result is accepted (issue 12.5)
    with pytest.raises(GraphError, match="unknown tool_call_id 'c9'"):
        g.validate([Message("tool", "r", tool_call_id="c9")])
    assert len(g) == 2 and set(g.call_owner) == {"c1"} and not g.result_of  # nothing changed


def test_simultaneous_retries_with_one_key_from_two_instances_store_once(shared_db):
    from concurrent.futures import ThreadPoolExecutor

    a, b = open_store(shared_db), open_store(shared_db)
    a.create_session("s1")
    a.append("s1", EVENTS[:1])
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda st: st.append("s1", EVENTS[1:3], idempotency_key="same"), [a, b] * 6))
    assert answers == [[1, 2]] * 12
    assert a.messages("s1") == EVENTS[:3] and len(b.graph("s1")) == 3
    a.close(), b.close()


def test_sqlite_append_on_a_stale_cached_graph_is_decided_again_on_what_is_stored(tmp_path):
    """An SQLite append runs BEGIN, its INSERTs and COMMIT only (no length query, issue 13); when
    another instance appended meanwhile, the taken position makes it check and write again after
    the stored events: each event stored once, in order, and the checks made against them."""
    a, b = SQLiteStore(tmp_path / "s.sqlite"), SQLiteStore(tmp_path / "s.sqlite")
    a.create_session("s")
    a.append("s", EVENTS[:2])  # system, user; a's graph is cached
    assert len(b.graph("s")) == 2
    seen: list[str] = []
    a._db.set_trace_callback(seen.append)
    a.append("s", EVENTS[2])  # the assistant calling c1 and c2
    a._db.set_trace_callback(None)
    assert [q.split(" ")[0] for q in seen] == ["BEGIN", "INSERT", "COMMIT"]
    b.append("s", EVENTS[3])  # b's graph is one behind: c1 unknown there; valid once caught up
    b.append("s", Message("user", "from b"))
    a.append("s", Message("user", "from a"), expected_length=5)  # a's graph holds 3 (not 5): decided again
    with pytest.raises(AppendConflict) as err:
        b.append("s", Message("user", "late"), expected_length=5)
    assert err.value.length == 6  # the stored length, not b's cached 5
    b.append("s", Message("user", "b2"))
    assert a.append("s", Message("user", "a2")) == [7]  # a's graph holds 6: position 6 taken, then 7
    stored = [m.content for m in a.messages("s")]
    assert stored == [m.content for m in EVENTS[:4]] + ["from b", "from a", "b2", "a2"]
    assert [m.content for m in a.graph("s").messages] == stored == [m.content for m in b.graph("s").messages]
    c = SQLiteStore(tmp_path / "s.sqlite")
    c.append("s", Message("assistant", "", (ToolCall("c9", "x"),)))
    b.append("s", Message("tool", "r9", tool_call_id="c9"))  # valid only after c's call: caught up, then stored
    with pytest.raises(GraphError, match="c9"):
        a.append("s", Message("assistant", "", (ToolCall("c9", "x"),)))  # c9 is taken in what is stored
    assert [m.role for m in c.graph("s").messages[-2:]] == ["assistant", "tool"] and len(a.messages("s")) == 10
    a.close(), b.close(), c.close()


def test_two_instances_creating_one_new_session_at_once_one_succeeds(shared_db):
    """Issue 38, class 1: two workers (separate store instances on one database) creating the
    same new session at once. Exactly one creates it; the other gets StoreError ("already
    exists"), never the database's unique-key violation; 20 rounds."""
    stores = [open_store(shared_db), open_store(shared_db)]
    try:
        for round_ in range(20):
            sid = f"race-{round_}"
            barrier, outcomes = threading.Barrier(2), []

            def create(store, sid=sid, barrier=barrier, outcomes=outcomes):
                barrier.wait()
                try:
                    store.create_session(sid)
                    outcomes.append("created")
                except StoreError as exc:
                    outcomes.append("exists" if "already exists" in str(exc) else repr(exc))
                except Exception as exc:  # the bug: sqlite3.IntegrityError / psycopg UniqueViolation
                    outcomes.append(repr(exc))

            threads = [threading.Thread(target=create, args=(s,)) for s in stores]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(outcomes) == ["created", "exists"], outcomes
            assert stores[1].has_session(sid) and stores[0].messages(sid) == []
    finally:
        for s in stores:
            s.close()


def test_policy_state_is_replaced_per_key_and_seen_by_another_instance(make_store):
    """Issue 49: the state a policy keeps between renders of a session (cache-stable rendering's
    previous rendering) is one text per session and key, the last written one; a second instance
    on the same database reads what the first wrote; an unknown session is refused."""
    a = make_store()
    a.create_session("s")
    a.create_session("t")
    assert a.policy_state("s", "k") is None
    a.put_policy_state("s", "k", "first")
    a.put_policy_state("s", "k", "second")
    a.put_policy_state("t", "k", "other session")
    b = make_store() if not isinstance(a, MemoryStore) else a
    assert b.policy_state("s", "k") == "second" and b.policy_state("t", "k") == "other session"
    assert b.policy_state("s", "j") is None
    with pytest.raises(StoreError, match="no session 'u'"):
        a.put_policy_state("u", "k", "x")
    for s in {id(a): a, id(b): b}.values():
        s.close()
