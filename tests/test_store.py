"""One contract, run over every store."""

import numpy as np
import pytest

from historygraph.events import Message, ToolCall
from historygraph.graph import GraphError
from historygraph.store import MemoryStore, SQLiteStore, StoreError


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request, tmp_path):
    def make():
        return MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "db" / "hg.sqlite")
    return make


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
