"""The chat-model client: OpenAI-compatible endpoint (httpx MockTransport double) and configuration."""

import json

import httpx
import pytest

from historygraph.llm import ModelError, ModelUsage, OpenAICompatibleModel, endpoint_config


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
    m = OpenAICompatibleModel("http://upstream/v1", "m", transport=httpx.MockTransport(lambda r: httpx.Response(503, text="busy")))
    with pytest.raises(ModelError, match="503"):
        m.complete([{"role": "user", "content": "x"}])


def test_endpoint_config_from_environment(monkeypatch):
    monkeypatch.setenv("HISTORYGRAPH_LLM_BASE_URL", "http://h/v1")
    monkeypatch.delenv("HISTORYGRAPH_LLM_MODEL", raising=False)
    with pytest.raises(ModelError, match="HISTORYGRAPH_LLM_MODEL"):
        endpoint_config()
    monkeypatch.setenv("HISTORYGRAPH_LLM_MODEL", "gpt-x")
    assert endpoint_config() == {"base_url": "http://h/v1", "model": "gpt-x"}
