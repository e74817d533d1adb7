"""A full disk under the store (issue 38, class 6, the proxy's half): a request whose messages cannot
be stored gets 507 in its API's error shape saying the store's disk is full and is not forwarded,
``/health`` says so until a write succeeds again, and nothing stored is lost.

The full disk is simulated: the SQLite store's connection is wrapped so that its writes raise what
SQLite raises on a full disk (``sqlite3.OperationalError: database or disk is full``) while
``full`` is set; PostgreSQL's ``disk_full`` (SQLSTATE 53100) is checked on its error class. The
proxy runs in-process in front of the rule-enforcing fake provider (tests/fake_upstream.py)."""

from __future__ import annotations

import asyncio
import errno
import sqlite3

import httpx
import psycopg.errors
import pytest

from historygraph import Message
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.store import MemoryStore, SQLiteStore, StoreFullError
from historygraph.store.full import disk_full


WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "COMMIT")


class FullDisk:
    """A ``sqlite3.Connection`` whose writes fail as on a full disk while :attr:`full` is set."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db, self.full = db, False

    def _check(self, sql: str) -> None:
        if self.full and sql.lstrip().upper().startswith(WRITES):
            raise sqlite3.OperationalError("database or disk is full")

    def execute(self, sql: str, *args):
        self._check(sql)
        return self.db.execute(sql, *args)

    def executemany(self, sql: str, *args):
        self._check(sql)
        return self.db.executemany(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self.db, name)


TURN1 = {"openai": [{"role": "user", "content": "first question"}],
         "anthropic": [{"role": "user", "content": "first question"}],
         "responses": [{"role": "user", "content": "first question"}]}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}


def body(api: str, turns: list) -> dict:
    field = "input" if api == "responses" else "messages"
    return {"model": "m", field: turns, **({"max_tokens": 20} if api == "anthropic" else {})}


def answer_turn(api: str, data: dict) -> list:
    """The turn(s) a client appends for the answer it got."""
    if api == "openai":
        return [data["choices"][0]["message"]]
    if api == "anthropic":
        return [{"role": "assistant", "content": data["content"]}]
    return data["output"]


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
def test_a_full_disk_gets_507_in_the_api_shape_and_health_says_so_until_a_write_succeeds(api, fake, tmp_path):
    store = SQLiteStore(tmp_path / "full.sqlite")
    disk = store._db = FullDisk(store._db)
    sid = f"full-{api}"

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune", budget=4000, upstream=fake + "/v1",
                                      anthropic_upstream=fake), store=store)
        headers = {"X-HistoryGraph-Session": sid}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c, \
                httpx.AsyncClient(base_url=fake, timeout=30) as up:
            first = await c.post(PATHS[api], json=body(api, TURN1[api]), headers=headers)
            assert first.status_code == 200, first.text
            stored = [m.to_dict() for m in store.messages(sid)]
            assert len(stored) == 2  # the question and the answer
            turns = TURN1[api] + answer_turn(api, first.json()) + [{"role": "user", "content": "second question"}]
            forwarded = len((await up.get("/_requests")).json())

            disk.full = True
            r = await c.post(PATHS[api], json=body(api, turns), headers=headers)
            assert r.status_code == 507, r.text
            error = r.json()
            if api == "anthropic":
                assert error["type"] == "error" and error["error"]["type"] == "api_error"
            else:
                assert error["error"]["type"] == "api_error" and error["error"]["param"] == "store"
            assert "disk is full" in error["error"]["message"] and "not forwarded" in error["error"]["message"]
            assert len((await up.get("/_requests")).json()) == forwarded  # nothing went upstream
            health = await c.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "error"
            assert health.json()["store"].startswith("disk full: ") and "database or disk is full" in health.json()["store"]
            assert [m.to_dict() for m in store.messages(sid)] == stored  # nothing lost, nothing half-written

            disk.full = False  # space freed: the same request again
            r = await c.post(PATHS[api], json=body(api, turns), headers=headers)
            assert r.status_code == 200, r.text
            assert (await c.get("/health")).json()["status"] == "ok"
            assert [m.content for m in store.messages(sid)] == [m["content"] for m in stored] + [
                "second question", store.messages(sid)[-1].content]
            assert len((await up.get("/_rejections")).json()) == 0
        await app.state.proxy.transport.aclose()

    try:
        asyncio.run(main())
    finally:
        store._db = disk.db
        store.close()


def test_an_answer_that_cannot_be_stored_is_relayed_and_stored_from_the_next_request(tmp_path):
    """The disk fills while the upstream answers: the client gets the answer (it was paid for),
    ``/health`` says the disk is full, and the answer is stored from the client's next request,
    which carries it back."""
    store = SQLiteStore(tmp_path / "answer.sqlite")
    disk = store._db = FullDisk(store._db)

    calls = []

    def upstream(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        disk.full = len(calls) == 1  # the first request's messages are stored; its answer will not be
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "the answer"}}]})

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune", upstream="http://upstream/v1"), store=store)
        app.state.proxy.transport = httpx.MockTransport(upstream)
        headers = {"X-HistoryGraph-Session": "answer"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c:
            q1 = [{"role": "user", "content": "q1"}]
            r = await c.post("/v1/chat/completions", json={"model": "m", "messages": q1}, headers=headers)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "the answer"
            assert [m.content for m in store.messages("answer")] == ["q1"]
            assert (await c.get("/health")).status_code == 503
            disk.full = False
            q2 = q1 + [{"role": "assistant", "content": "the answer"}, {"role": "user", "content": "q2"}]
            r = await c.post("/v1/chat/completions", json={"model": "m", "messages": q2}, headers=headers)
            assert r.status_code == 200
            assert [m.content for m in store.messages("answer")] == ["q1", "the answer", "q2", "the answer"]
            assert (await c.get("/health")).json()["status"] == "ok"

    try:
        asyncio.run(main())
    finally:
        store._db = disk.db
        store.close()


def test_the_session_api_answers_507_on_a_full_disk(tmp_path):
    store = SQLiteStore(tmp_path / "api.sqlite")
    disk = store._db = FullDisk(store._db)

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune"), store=store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c:
            ok = await c.post("/api/sessions/s/events", json={"messages": [{"role": "user", "content": "a"}], "create": True})
            assert ok.status_code == 200
            disk.full = True
            r = await c.post("/api/sessions/s/events", json={"messages": [{"role": "user", "content": "b"}]})
            assert r.status_code == 507 and "disk is full" in r.json()["detail"]
            disk.full = False
            assert [m.content for m in store.messages("s")] == ["a"]

    try:
        asyncio.run(main())
    finally:
        store._db = disk.db
        store.close()


def test_each_backends_full_disk_is_recognised():
    assert disk_full(sqlite3.OperationalError("database or disk is full"))
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full(psycopg.errors.DiskFull('could not extend file "base/16384/16385": No space left on device'))
    assert not disk_full(sqlite3.OperationalError("database is locked"))
    assert not disk_full(psycopg.errors.UniqueViolation("duplicate key"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))


class PgFullStore(MemoryStore):
    """A store whose event writes raise PostgreSQL's disk_full while ``full`` is set."""

    full_disk = False

    def _write_events(self, session_id, start, messages):
        if self.full_disk:
            raise psycopg.errors.DiskFull('could not extend file "base/16384/16385": No space left on device')
        super()._write_events(session_id, start, messages)


def test_a_postgres_disk_full_error_becomes_store_full_error_and_clears_after_a_write():
    s = PgFullStore()
    s.create_session("p")
    s.full_disk = True
    with pytest.raises(StoreFullError, match="disk is full") as caught:
        s.append("p", Message("user", "lost?"))
    assert caught.value.errno == errno.ENOSPC and "could not extend file" in s.full
    assert s.messages("p") == [] and len(s.graph("p")) == 0
    s.full_disk = False
    assert s.append("p", Message("user", "kept")) == [0]
    assert s.full is None


def test_the_507_does_not_tell_the_client_the_stores_path_the_log_does(tmp_path, caplog):
    """Issue 50: the 507's message named the store's absolute file path to any client."""
    import logging

    store = SQLiteStore(tmp_path / "secret-dir" / "hg.sqlite")
    disk = store._db = FullDisk(store._db)
    where = str(tmp_path / "secret-dir")

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune", upstream="http://upstream.invalid/v1"), store=store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c:
            disk.full = True
            proxied = await c.post("/v1/chat/completions", json=body("openai", TURN1["openai"]),
                                   headers={"X-HistoryGraph-Session": "p"})
            appended = await c.post("/api/sessions/s/events", json={"messages": [{"role": "user", "content": "b"}], "create": True})
            health = await c.get("/health")
            disk.full = False
        return proxied, appended, health

    try:
        with caplog.at_level(logging.ERROR, logger="historygraph"):
            proxied, appended, health = asyncio.run(main())
    finally:
        store._db = disk.db
        store.close()
    assert proxied.status_code == 507 and appended.status_code == 507 and health.status_code == 503
    assert "disk is full" in proxied.json()["error"]["message"] and "disk is full" in appended.json()["detail"]
    for r in (proxied, appended, health):
        assert where not in r.text and "hg.sqlite" not in r.text, r.text
    logged = [getattr(rec, "error", "") for rec in caplog.records if "disk full" in rec.getMessage()]
    assert len(logged) == 2 and all(where in e for e in logged)  # the server's log names it, for each refusal


def test_a_full_disk_error_keeps_its_file_name_from_clients():
    exc = StoreFullError("/srv/hg/hg.sqlite", OSError(errno.ENOSPC, "No space left on device", "/srv/hg/hg.sqlite-wal"))
    assert "/srv/hg" in str(exc) and "/srv/hg" not in exc.reason
    assert exc.reason == "the store's disk is full: OSError: [Errno 28] No space left on device"
