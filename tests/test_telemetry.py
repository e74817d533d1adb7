"""OpenTelemetry spans (issue 40): one per rendering and one per proxied request, with the GenAI
semantic conventions' attributes, read back through the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from historygraph import MemoryStore, Session, render_messages
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from test_omitted import steps

sys.path.insert(0, str(Path(__file__).parent))
from fake_upstream import build_app  # noqa: E402

EXPORTER = InMemorySpanExporter()


@pytest.fixture
def exported():
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the first test here sets the process's provider
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if not getattr(provider, "_historygraph_test", False):
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        provider._historygraph_test = True
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def test_a_session_render_is_one_span_with_its_policy_budget_tokens_and_omissions(exported):
    s = Session("run", policy="observation-masking", budget=1500, cache_stable=False)  # the window of tests/test_omitted.py
    for m in steps():
        s.add(m)
    s.render()
    [span] = exported.get_finished_spans()
    a = span.attributes
    assert span.name == "historygraph.render" and span.kind == trace.SpanKind.INTERNAL
    # the window leaves out c0, c1, c2 (tests/test_omitted.py), of 17 messages
    assert (a["historygraph.policy"], a["historygraph.budget"], a["historygraph.omitted"], a["historygraph.events"]) == \
        ("observation-masking", 1500, 3, 17)
    assert a["historygraph.history_tokens"] == s.rendering.history_tokens <= 1500
    assert a["historygraph.input_tokens"] == s.rendering.input_tokens and a["historygraph.session_id"] == "run"


def test_render_messages_is_traced_too(exported):
    render_messages(steps(n=2), budget=5000, policy="prune", session="lib", store=MemoryStore())
    [span] = exported.get_finished_spans()
    # a stored session renders cache-stable by default: the span names the wrapper
    assert span.attributes["historygraph.omitted"] == 0 and span.attributes["historygraph.policy"] == "prune-stable"


def _proxy(policy: str = "observation-masking", budget: int = 1500, cache_stable: bool = True):
    app = create_app(ServerConfig(upstream="http://upstream/v1", anthropic_upstream="http://upstream", store=":memory:",
                                  policy=policy, budget=budget, calibrate=False, cache_stable=cache_stable))
    app.state.proxy.transport = httpx.ASGITransport(app=build_app())
    return app


def _post(app, path: str, body: dict, session: str) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            return await c.post(path, json=body, headers={"X-HistoryGraph-Session": session, "x-api-key": "k",
                                                          "anthropic-version": "2023-06-01"})
    return asyncio.run(go())


def test_a_proxied_chat_request_is_a_genai_client_span_parent_of_its_render(exported):
    app = _proxy(cache_stable=False)  # the window of tests/test_omitted.py, 3 results left out
    r = _post(app, "/v1/chat/completions", {"model": "gpt-test", "messages": steps()}, "p1")
    assert r.status_code == 200
    spans = {s.name: s for s in exported.get_finished_spans()}
    req, render = spans["chat gpt-test"], spans["historygraph.render"]
    a = req.attributes
    assert req.kind == trace.SpanKind.CLIENT
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.request.model"]) == ("chat", "openai", "gpt-test")
    usage = r.json()["usage"]  # what the provider reported, as the client received it
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"] and a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert a["historygraph.omitted"] == int(r.headers["x-historygraph-omitted"]) == 3
    assert a["historygraph.session_id"] == a["gen_ai.conversation.id"] == "p1" and a["historygraph.budget"] == 1500
    assert a["historygraph.policy"] == "observation-masking" and a["http.response.status_code"] == 200
    assert a["historygraph.history_tokens"] == render.attributes["historygraph.history_tokens"]
    assert render.parent is not None and render.parent.span_id == req.context.span_id
    assert render.context.trace_id == req.context.trace_id and req.status.status_code != trace.StatusCode.ERROR


def test_a_streamed_anthropic_request_reports_the_streams_output_tokens(exported):
    app = _proxy(policy="prune", budget=6000)
    turns = [{"role": "user", "content": "hello"}]
    r = _post(app, "/v1/messages", {"model": "claude-test", "max_tokens": 20, "stream": True, "messages": turns}, "a1")
    assert r.status_code == 200 and "message_stop" in r.text
    [req] = [s for s in exported.get_finished_spans() if s.name == "chat claude-test"]
    a = req.attributes
    assert a["gen_ai.provider.name"] == "anthropic" and a["gen_ai.request.model"] == "claude-test"
    assert a["gen_ai.usage.output_tokens"] == 1 and a["gen_ai.usage.input_tokens"] == 1  # the fake's message_delta / message_start
    assert a["historygraph.omitted"] == 0


def test_an_upstream_error_marks_the_span_failed(exported):
    app = _proxy()
    r = _post(app, "/v1/chat/completions", {"model": "error-model", "messages": steps(n=1)}, "e1")
    assert r.status_code == 429
    [req] = [s for s in exported.get_finished_spans() if s.name == "chat error-model"]
    assert req.status.status_code == trace.StatusCode.ERROR and req.attributes["error.type"] == "429"


def test_without_an_sdk_provider_nothing_records():
    code = ("from historygraph import Session, telemetry\n"
            "s = Session(policy='prune', budget=100); s.add({'role': 'user', 'content': 'hi'}); s.render()\n"
            "with telemetry.render_span('s', 100) as span: print(span.is_recording())\n"
            "print(telemetry.request_span('openai', 'm'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["False", "None"]
