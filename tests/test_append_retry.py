"""Session API appends are safe to retry (issue 17): ``Idempotency-Key`` and ``expected_length`` on
``POST /api/sessions/{id}/events``, over SQLite and PostgreSQL, and the same in ``Session.add``.
The SIGKILL tests (a connection cut after the commit, then a retry) are in test_faults.py."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager

import httpx
import pytest

from historygraph import Session, render_messages
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.store import AppendConflict, open_store
from test_store import pg_dsn  # noqa: F401 (fixture)

EVENTS = "/api/sessions/{}/events"


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else str(tmp_path / "api.sqlite")


def _app(db: str):
    return create_app(ServerConfig(upstream="http://127.0.0.1:9/v1", store=db, policy="prune"))


def _calls(app, requests: list[tuple[str, str, dict]]) -> list[httpx.Response]:
    """Run ``(method, path, kwargs)`` requests concurrently against ``app`` (in-process)."""
    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            return await asyncio.gather(*(c.request(m, p, **kw) for m, p, kw in requests))
    return asyncio.run(run())


def _post(app, sid: str, body: dict, key: str | None = None) -> httpx.Response:
    return _calls(app, [("POST", EVENTS.format(sid), {"json": body, "headers": {"Idempotency-Key": key} if key else {}})])[0]


def _contents(app, sid: str) -> list[str]:
    return [m["content"] for m in _calls(app, [("GET", f"/api/sessions/{sid}", {})])[0].json()["messages"]]


def test_retry_with_the_same_key_gets_the_first_answer_and_stores_once(db):
    app = _app(db)
    body = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "create": True}
    first = _post(app, "s", body, "k1")
    assert first.status_code == 200 and first.json() == {"positions": [0, 1]}
    _post(app, "s", {"messages": [{"role": "user", "content": "c"}]}, "k2")
    again = _post(app, "s", {**body, "create": False}, "k1")  # create is not part of what must match
    assert (again.status_code, again.json()) == (200, {"positions": [0, 1]})
    assert _contents(app, "s") == ["a", "b", "c"]
    restarted = _app(db)  # another instance (a restarted server) answers from the stored key
    assert _post(restarted, "s", {"messages": [{"role": "user", "content": "c"}]}, "k2").json() == {"positions": [2]}
    assert _contents(restarted, "s") == ["a", "b", "c"]


def test_same_key_with_a_different_body_is_a_409_naming_the_key(db):
    app = _app(db)
    _post(app, "s", {"messages": [{"role": "user", "content": "a"}], "create": True}, "key-42")
    for body in ({"messages": [{"role": "user", "content": "other"}]},
                 {"messages": [{"role": "user", "content": "a"}], "expected_length": 0}):
        r = _post(app, "s", body, "key-42")
        assert r.status_code == 409
        assert r.json() == {"detail": "Idempotency-Key: 'key-42' was already used in session 's' with a different body",
                            "length": 1}
    assert _contents(app, "s") == ["a"]


def test_expected_length_appends_at_that_position_or_gets_409_with_the_length(db):
    app = _app(db)
    assert _post(app, "s", {"messages": [{"role": "user", "content": "a"}], "create": True, "expected_length": 0}).json() \
        == {"positions": [0]}
    r = _post(app, "s", {"messages": [{"role": "user", "content": "b"}], "expected_length": 0})
    assert (r.status_code, r.json()) == (409, {"detail": "expected_length: session 's' has 1 events, not 0", "length": 1})
    assert _post(app, "s", {"messages": [{"role": "user", "content": "b"}], "expected_length": 1}).json() == {"positions": [1]}
    assert _contents(app, "s") == ["a", "b"]


def test_a_refused_append_with_create_creates_no_session(tmp_path):
    app = _app(str(tmp_path / "refused.sqlite"))
    r = _post(app, "new", {"messages": [{"role": "user", "content": "a"}], "create": True, "expected_length": 2})
    assert (r.status_code, r.json()) == (409, {"detail": "expected_length: session 'new' has 0 events, not 2", "length": 0})
    r = _post(app, "new", {"messages": [{"role": "tool", "tool_call_id": "c9", "content": "x"}], "create": True})
    assert r.status_code == 400 and "c9" in r.json()["detail"]
    assert _calls(app, [("GET", "/api/sessions", {})])[0].json() == []
    assert _post(app, "new", {"messages": [{"role": "user", "content": "a"}], "create": True, "expected_length": 0}).json() \
        == {"positions": [0]}


def test_bad_keys_and_lengths_get_400_and_422_naming_them(tmp_path):
    app = _app(str(tmp_path / "bad.sqlite"))
    body = {"messages": [{"role": "user", "content": "a"}], "create": True}
    r = _post(app, "s", body, "x" * 256)
    assert r.status_code == 400 and r.json()["detail"] == "Idempotency-Key: must be 1 to 255 characters, got 256"
    r = _calls(app, [("POST", EVENTS.format("s"), {"json": body, "headers": {"Idempotency-Key": ""}})])[0]
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["detail"]
    r = _post(app, "s", {**body, "expected_length": -1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "expected_length"]
    assert _calls(app, [("GET", "/api/sessions", {})])[0].json() == []  # nothing created


def test_openapi_documents_the_header_and_the_409(tmp_path):
    spec = _calls(_app(str(tmp_path / "o.sqlite")), [("GET", "/openapi.json", {})])[0].json()
    op = spec["paths"]["/api/sessions/{session_id}/events"]["post"]
    assert [p["name"] for p in op["parameters"] if p["in"] == "header"] == ["Idempotency-Key"]
    assert "409" in op["responses"]
    assert "expected_length" in spec["components"]["schemas"]["AppendRequest"]["properties"]


def test_concurrent_appends_with_expected_length_keep_order_through_two_instances(db):
    """Four writers, two server instances on one database: each event names the one before it and
    is sent with expected_length = its position; a 409 makes the writer re-read and resend."""
    apps = [_app(db), _app(db)]
    _post(apps[0], "chain", {"messages": [], "create": True})

    async def writer(w: int) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[w % 2]), base_url="http://proxy") as c:
            for k in range(6):
                while True:
                    at = len((await c.get("/api/sessions/chain")).json()["messages"])
                    r = await c.post(EVENTS.format("chain"), json={
                        "messages": [{"role": "user", "content": f"w{w}.{k} after {at - 1}"}], "expected_length": at})
                    if r.status_code == 200:
                        assert r.json() == {"positions": [at]}
                        break
                    assert r.status_code == 409 and r.json()["length"] > at

    async def run():
        await asyncio.gather(*(writer(w) for w in range(4)))
    asyncio.run(run())
    contents = _contents(apps[1], "chain")
    assert len(contents) == 24
    assert all(c.endswith(f" after {i - 1}") for i, c in enumerate(contents)), contents
    for w in range(4):
        assert [c.split()[0] for c in contents if c.startswith(f"w{w}.")] == [f"w{w}.{k}" for k in range(6)]


def test_library_session_add_uses_the_same_keys(db):
    s = Session("lib", store=open_store(db))
    assert s.add({"role": "user", "content": "hi"}, idempotency_key="t1") == 0
    assert s.add({"role": "user", "content": "hi"}, idempotency_key="t1") == 0  # the retry: nothing new
    with pytest.raises(AppendConflict, match="'t1'"):
        s.add({"role": "user", "content": "bye"}, idempotency_key="t1")
    with pytest.raises(AppendConflict, match="has 1 events, not 0"):
        s.add({"role": "user", "content": "bye"}, expected_length=0)
    assert s.add({"role": "user", "content": "bye"}, expected_length=1) == 1
    again = Session("lib", store=open_store(db))  # a new process with the same store
    assert again.add({"role": "user", "content": "hi"}, idempotency_key="t1") == 0
    assert [m["content"] for m in again.render()] == ["hi", "bye"]
    again.store.close()  # writes the render's queued record while the database is there
    s.store.close()


def _cut_after_next_commit(store) -> None:
    """The store's next append commits, then raises as a dropped database connection would."""
    transaction = store._write_transaction

    @contextmanager
    def cut(session_id):
        with transaction(session_id):
            yield
        store._write_transaction = transaction
        raise ConnectionError("connection lost after the commit")

    store._write_transaction = cut


def test_library_calls_cut_after_the_commit_are_retried_without_duplicates(db):
    """``Session.add`` retried with its key, and the one-call API retried with the same messages
    (matched against the stored prefix, as the proxy does), store the cut call's events once."""
    store = open_store(db)
    s = Session("lib-cut", store=store)
    s.add({"role": "user", "content": "first"}, idempotency_key="t0")
    _cut_after_next_commit(store)
    with pytest.raises(ConnectionError):
        s.add({"role": "user", "content": "second"}, idempotency_key="t1")
    assert s.add({"role": "user", "content": "second"}, idempotency_key="t1") == 1
    assert [m.content for m in open_store(db).messages("lib-cut")] == ["first", "second"]

    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]
    _cut_after_next_commit(store)
    with pytest.raises(ConnectionError):
        render_messages(messages, budget=500, policy="prune", session="one-call", store=store)
    assert render_messages(messages, budget=500, policy="prune", session="one-call", store=store) == messages
    assert [m.content for m in open_store(db).messages("one-call")] == ["q", "a", "q2"]
    assert store.sessions_with_prefix("one-call~") == []  # no branch either
    store.close()  # writes the renders' queued records while the database is there
