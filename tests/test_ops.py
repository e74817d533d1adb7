"""Operations: /health, /metrics (Prometheus text, parsed with prometheus_client's own parser)
and structured JSON logs that carry the session id and never a key. In-process: the proxy app and
a minimal upstream app joined by httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import io
import json

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client.parser import text_string_to_metric_families

from historygraph import Message, MemoryStore, SQLiteStore, TokenCounter
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.server import logs

KEY = "sk-test-NEVER-LOG-123456"
BIG, SMALL = "line\n" * 200, "line\n" * 150  # 400 and 300 tokens (o200k_base)
HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is in big.txt and small.txt?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "big.txt"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": BIG},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "read", "arguments": '{"path": "small.txt"}'}}]},
    {"role": "tool", "tool_call_id": "c2", "content": SMALL},
    {"role": "user", "content": "Summarise both."},
]


def upstream_app() -> FastAPI:
    up = FastAPI()

    @up.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if body["model"] == "broken":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, 500)
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 1, "total_tokens": 1001}}

    @up.post("/v1/messages")
    async def messages(request: Request):
        return {"id": "m", "type": "message", "role": "assistant", "model": "claude", "stop_reason": "end_turn",
                "content": [{"type": "text", "text": "ok"}], "usage": {"input_tokens": 10, "output_tokens": 1}}

    return up


def proxy(store=None, upstream: str = "http://upstream/v1"):
    app = create_app(ServerConfig(upstream=upstream, anthropic_upstream="http://upstream", store=":memory:",
                                  policy="prune", budget=500), store=store or MemoryStore())
    if upstream.startswith("http://upstream"):
        app.state.proxy.transport = httpx.ASGITransport(app=upstream_app())
    return app


def call(app, method: str, path: str, **kw) -> httpx.Response:
    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            return await c.request(method, path, **kw)
    return asyncio.run(run())


def samples(app) -> dict[tuple[str, tuple], float]:
    r = call(app, "GET", "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    om = call(app, "GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.endswith("# EOF\n")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def chat(app, model: str = "m", session: str = "ops-1") -> httpx.Response:
    return call(app, "POST", "/v1/chat/completions", json={"model": model, "messages": HISTORY},
                headers={"Authorization": f"Bearer {KEY}", "X-HistoryGraph-Session": session})


def test_health_reports_the_store():
    app = proxy()
    r = call(app, "GET", "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["store"] == "ok"
    broken = SQLiteStore(":memory:")
    app = proxy(store=broken)
    broken.close()
    r = call(app, "GET", "/health")
    assert r.status_code == 503 and r.json()["status"] == "error" and "closed" in r.json()["store"]


def test_metrics_count_requests_tokens_and_errors():
    app = proxy()
    assert chat(app).status_code == 200
    s = samples(app)
    assert s[("historygraph_requests_total", (("api", "openai"), ("status", "200")))] == 1
    assert s[("historygraph_render_seconds_count", (("policy", "prune"),))] == 1
    counter = TokenCounter()
    history_in = sum(counter.count_message(Message.from_openai(m)) for m in HISTORY[1:-1])  # system, current user outside B
    sent = s[("historygraph_history_tokens_out_total", (("policy", "prune"),))]
    assert s[("historygraph_history_tokens_in_total", (("policy", "prune"),))] == history_in
    assert 0 < sent <= 500 < history_in  # B = 500: the 400-token result did not fit with the 300-token one
    assert s[("historygraph_tokens_saved_total", (("policy", "prune"),))] == history_in - sent
    # the upstream reported 1000 prompt tokens: the calibration ratio is 1000 / our estimate
    ratio = s[("historygraph_calibration_ratio", ())]
    assert ratio == app.state.proxy.calibration.ratio and ratio > 1 and s[("historygraph_calibration_observations", ())] == 1

    assert chat(app, model="broken").status_code == 500
    assert call(app, "POST", "/v1/messages", json={"model": "claude", "max_tokens": 5,
                                                   "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    s = samples(app)
    assert s[("historygraph_upstream_errors_total", (("api", "openai"), ("kind", "500")))] == 1
    assert s[("historygraph_requests_total", (("api", "openai"), ("status", "500")))] == 1
    assert s[("historygraph_requests_total", (("api", "anthropic"), ("status", "200")))] == 1
    assert s[("historygraph_render_seconds_count", (("policy", "prune"),))] == 3


def test_an_unreachable_upstream_is_counted():
    app = proxy(upstream="http://127.0.0.1:9/v1")
    assert chat(app).status_code == 502
    assert samples(app)[("historygraph_upstream_errors_total", (("api", "openai"), ("kind", "unreachable")))] == 1


def test_an_unreachable_upstream_is_a_warning_with_the_reason_and_the_request_record_names_the_session():
    """Walkthrough finding: a refused upstream showed only as an INFO "request" record with status
    502 and ``session: null``. Port 9 (discard) has no listener on the test machine: the connection
    is refused, as the reason says; the client's key is never logged."""
    out = io.StringIO()
    handler = logs.configure("INFO", stream=out)
    try:
        app = proxy(upstream="http://127.0.0.1:9/v1")
        assert chat(app, session="down-1").status_code == 502
    finally:
        logs.logging.getLogger("historygraph").removeHandler(handler)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    [warning] = [r for r in records if r["message"] == "upstream unreachable"]
    assert warning["level"] == "WARNING" and warning["session"] == "down-1" and warning["api"] == "openai"
    assert "connection refused at 127.0.0.1:9" in warning["reason"] and KEY not in out.getvalue()
    [request] = [r for r in records if r["message"] == "request"]
    assert (request["status"], request["session"]) == (502, "down-1")


def test_logs_are_json_with_the_session_and_never_the_key():
    out = io.StringIO()
    handler = logs.configure("INFO", stream=out)
    try:
        app = proxy()
        chat(app, session="logged-1")
        chat(app, model="broken", session="logged-1")  # same history, no stored answer: a branch
    finally:
        logs.logging.getLogger("historygraph").removeHandler(handler)
    text = out.getvalue()
    assert KEY not in text and "NEVER-LOG" not in text
    records = [json.loads(line) for line in text.splitlines()]
    rendered = [r for r in records if r["message"] == "rendered"]
    assert rendered[0]["session"] == "logged-1" and rendered[0]["policy"] == "prune-stable" and rendered[0]["budget"] == 500
    assert rendered[0]["history_tokens_out"] <= 500 and rendered[0]["level"] == "INFO"
    requests = [r for r in records if r["message"] == "request"]
    assert [(r["api"], r["status"], r["session"]) for r in requests] == [("openai", 200, "logged-1"), ("openai", 500, "logged-1~1")]


def test_the_log_names_the_policy_as_the_records_do():
    """Issue 50: the log said ``"policy": "prune"`` where the session's omission records (and the
    rendering) say ``prune-stable``: the cache-stable wrapper is on by default."""
    out = io.StringIO()
    handler = logs.configure("INFO", stream=out)
    try:
        app = proxy()
        chat(app, session="named-1")
        call(app, "POST", "/v1/chat/completions", json={"model": "m", "messages": HISTORY},  # over B: the warning too
             headers={"Authorization": f"Bearer {KEY}", "X-HistoryGraph-Session": "named-2", "X-HistoryGraph-Budget": "1"})
    finally:
        logs.logging.getLogger("historygraph").removeHandler(handler)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    [stored] = app.state.proxy.store.omitted("named-1")
    rendered = [r for r in records if r["message"] == "rendered"]
    [over] = [r for r in records if r["message"] == "over budget"]
    assert stored["policy"] == "prune-stable" and [r["policy"] for r in rendered] == ["prune-stable"] * 2
    assert over["policy"] == "prune-stable"


def test_credentials_are_redacted_from_any_log_text():
    assert logs.redact(f"upstream said: invalid key {KEY}") == "upstream said: invalid key [redacted]"
    assert logs.redact("Authorization: Bearer abc.def-123456") == "Authorization: [redacted]"
    assert logs.redact('{"x-api-key": "sk-ant-0123456789"}') == '{"[redacted]"}'
    assert logs.redact("budget 6000 tokens, session auto-1234") == "budget 6000 tokens, session auto-1234"


def test_serve_rejects_a_bad_log_format_by_name():
    from typer.testing import CliRunner

    from historygraph.cli import app as cli

    r = CliRunner().invoke(cli, ["serve", "--log-format", "xml", "--store", ":memory:"])
    assert r.exit_code != 0 and "--log-format must be 'json' or 'text', got 'xml'" in r.output


def test_text_logs_carry_the_same_fields_as_the_json_lines():
    """Walkthrough finding: ``serve --log-format text`` printed only "rendered" / "request", with
    no status, session or tokens; the plain lines now end with the record's fields as key=value,
    credentials masked as in the JSON lines."""
    import io
    import logging

    from historygraph.server.logs import configure

    out = io.StringIO()
    configure("INFO", out, json=False)
    logging.getLogger("historygraph.server").info("request", extra={"status": 502, "session": "s1",
                                                                    "note": "Bearer abcdefghijkl"})
    line = out.getvalue().strip()
    assert line.endswith("INFO historygraph.server request status=502 session=s1 note=[redacted]"), line


def test_the_request_record_of_a_refused_request_names_the_session_the_client_sent():
    """Walkthrough finding: a request the proxy refuses (400: a tool result answering no call) was
    logged with ``session: null`` although the client sent its session header."""
    out = io.StringIO()
    handler = logs.configure("INFO", stream=out)
    try:
        app = proxy()
        bad = [{"role": "user", "content": "u"}, {"role": "tool", "tool_call_id": "ghost", "content": "r"}]
        r = call(app, "POST", "/v1/chat/completions", json={"model": "m", "messages": bad},
                 headers={"Authorization": f"Bearer {KEY}", "X-HistoryGraph-Session": "refused-1"})
        assert r.status_code == 400 and "unknown tool_call_id 'ghost'" in r.text
    finally:
        logs.logging.getLogger("historygraph").removeHandler(handler)
    [request] = [json.loads(line) for line in out.getvalue().splitlines() if '"request"' in line]
    assert (request["status"], request["session"]) == (400, "refused-1")
