"""The chat-model client: OpenAI-compatible endpoint (httpx MockTransport double) and configuration."""

import json

import httpx
import pytest

from historygraph.models.chat import ModelError, ModelUsage, OpenAICompatibleModel, endpoint_config


def handler(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    assert request.url.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert body["messages"][-1]["content"] == "summarise"
    return httpx.Response(200, json={"choices": [{"message": {"content": "short"}}],
                                     "usage": {"prompt_tokens": 12, "completion_tokens": 3}})


def test_openai_compatible_call_reports_usage():
    m = OpenAICompatibleModel("http://upstream/v1", "m", "sk-test", transport=httpx.MockTransport(handler))
    c = m.complete([{"role": "user", "content": "summarise"}])
    assert (c.text, c.input_tokens, c.output_tokens) == ("short", 12, 3)
    u = ModelUsage()
    u.add(c)
    u.add(c)
    assert (u.calls, u.input_tokens, u.output_tokens) == (2, 24, 6)


def test_endpoint_error_is_reported_with_status():
    m = OpenAICompatibleModel("http://upstream/v1", "m", transport=httpx.MockTransport(lambda r: httpx.Response(503, text="busy")),
                              backoff=0)
    with pytest.raises(ModelError, match="503"):
        m.complete([{"role": "user", "content": "x"}])


def _flaky(answers):
    """A transport answering each request with the next item: a status code, or an exception to raise."""
    seen = []

    def handle(request):
        seen.append(request)
        a = answers[min(len(seen), len(answers)) - 1]
        if isinstance(a, Exception):
            raise a
        if a == 200:
            return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}],
                                             "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
        return httpx.Response(a, text="slow down", headers={"retry-after": "0"} if a == 429 else {})
    return httpx.MockTransport(handle), seen


def test_429_5xx_and_connection_errors_are_retried_until_an_answer():
    transport, seen = _flaky([429, 503, httpx.ConnectError("refused"), 500, 200])
    m = OpenAICompatibleModel("http://upstream/v1", "m", transport=transport, retries=5, backoff=0)
    c = m.complete([{"role": "user", "content": "x"}])
    assert (c.text, c.input_tokens, len(seen)) == ("ok", 5, 5)


def test_retries_stop_after_the_limit_and_name_the_tries():
    transport, seen = _flaky([502])
    m = OpenAICompatibleModel("http://upstream/v1", "m", transport=transport, retries=2, backoff=0)
    with pytest.raises(ModelError, match=r"502.*3 tries"):
        m.complete([{"role": "user", "content": "x"}])
    assert len(seen) == 3
    transport, seen = _flaky([httpx.ConnectError("refused")])
    m = OpenAICompatibleModel("http://upstream/v1", "m", transport=transport, retries=1, backoff=0)
    with pytest.raises(ModelError, match=r"unreachable after 2 tries"):
        m.complete([{"role": "user", "content": "x"}])


def test_client_errors_are_not_retried():
    transport, seen = _flaky([400, 200])
    m = OpenAICompatibleModel("http://upstream/v1", "m", transport=transport, backoff=0)
    with pytest.raises(ModelError, match="400"):
        m.complete([{"role": "user", "content": "x"}])
    assert len(seen) == 1


def test_retry_after_seconds_are_honoured(monkeypatch):
    import time as _time

    waits = []
    monkeypatch.setattr(_time, "sleep", waits.append)  # tenacity's default sleep is time.sleep
    def handle(request, n=[0]):
        n[0] += 1
        if n[0] == 1:
            return httpx.Response(429, headers={"retry-after": "7"})
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})
    m = OpenAICompatibleModel("http://upstream/v1", "m", transport=httpx.MockTransport(handle), backoff=0)
    assert m.complete([{"role": "user", "content": "x"}]).text == "ok"
    assert waits == [7.0]


def test_endpoint_config_from_environment(monkeypatch):
    monkeypatch.setenv("HISTORYGRAPH_LLM_BASE_URL", "http://h/v1")
    monkeypatch.delenv("HISTORYGRAPH_LLM_MODEL", raising=False)
    with pytest.raises(ModelError, match="HISTORYGRAPH_LLM_MODEL"):
        endpoint_config()
    monkeypatch.setenv("HISTORYGRAPH_LLM_MODEL", "gpt-x")
    assert endpoint_config() == {"base_url": "http://h/v1", "model": "gpt-x"}
    monkeypatch.setenv("HISTORYGRAPH_LLM_RETRIES", "2")
    assert endpoint_config()["retries"] == 2
    monkeypatch.setenv("HISTORYGRAPH_LLM_RETRIES", "-1")
    with pytest.raises(ModelError, match="HISTORYGRAPH_LLM_RETRIES"):
        endpoint_config()
