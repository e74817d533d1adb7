"""LiteLLM: the completion wrappers through the real litellm.completion with its built-in
mock_response (no network; the local cost map), and the proxy pre-call hook."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from historygraph import MemoryStore, PolicyError

# slow: importing LiteLLM costs about 4 CPU s in the process that runs these tests (docs/tests.md)
pytestmark = pytest.mark.slow

BIG, SMALL = "line\n" * 200, "line\n" * 150  # 400 and 300 tokens (o200k_base)
MESSAGES = [
    {"role": "user", "content": "What is in big.txt and small.txt?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "big.txt"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": BIG},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "read", "arguments": '{"path": "small.txt"}'}}]},
    {"role": "tool", "tool_call_id": "c2", "content": SMALL},
    {"role": "user", "content": "Summarise both."},
]


@pytest.fixture(scope="module")
def ll():
    """LiteLLM and the wrappers around it. Imported here, not at module level: every test process
    collects this file, and importing LiteLLM costs about 4 CPU s (docs/tests.md). Its offline
    settings are in tests/conftest.py."""
    litellm = pytest.importorskip("litellm", reason="litellm not installed (pip install 'historygraph[litellm]')")
    from litellm.integrations.custom_logger import CustomLogger

    from historygraph.integrations import litellm as wrappers

    class Recorder(CustomLogger):
        """Records the messages LiteLLM is about to send."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: list = []

        def log_pre_api_call(self, model, messages, kwargs):
            self.seen.append(messages)

    return SimpleNamespace(litellm=litellm, Recorder=Recorder, completion=wrappers.completion,
                           acompletion=wrappers.acompletion, HistoryGraphHook=wrappers.HistoryGraphHook)


@pytest.fixture
def recorder(ll):
    rec, before = ll.Recorder(), ll.litellm.callbacks
    ll.litellm.callbacks = [rec]
    yield rec
    ll.litellm.callbacks = before


def test_completion_sends_the_rendered_messages(ll, recorder):
    store = MemoryStore()
    r = ll.completion(model="gpt-4o-mini", messages=MESSAGES, budget=500, policy="prune", session="ll-1", store=store,
                      mock_response="Both hold 'line'.")
    assert r.choices[0].message.content == "Both hold 'line'."
    sent = recorder.seen[-1]
    assert sent[2]["content"].startswith("[tool result c1 omitted from this context (400 tokens)")
    assert sent[4]["content"] == SMALL and sent[0] is MESSAGES[0]
    assert store.graph("ll-1").result_by_id("c1").content == BIG


def test_acompletion_sends_the_rendered_messages(ll, recorder):
    asyncio.run(ll.acompletion(model="gpt-4o-mini", messages=MESSAGES, budget=500, policy="prune", mock_response="ok"))
    assert "omitted" in recorder.seen[-1][2]["content"]


def test_a_bad_policy_fails_before_anything_is_sent(ll, recorder):
    with pytest.raises(PolicyError):
        ll.completion(model="gpt-4o-mini", messages=MESSAGES, budget=500, policy="nope", mock_response="ok")
    assert recorder.seen == []


def test_proxy_hook_rewrites_chat_calls_only(ll):
    hook = ll.HistoryGraphHook(budget=500, policy="prune", store=MemoryStore())
    data = {"model": "gpt-4o-mini", "messages": MESSAGES, "metadata": {"historygraph_session": "proxy-1"}}
    out = asyncio.run(hook.async_pre_call_hook(None, None, data, "completion"))
    assert out["model"] == "gpt-4o-mini" and "omitted" in out["messages"][2]["content"]
    assert hook.store.sessions() == ["proxy-1"]
    emb = {"model": "text-embedding-3-small", "input": "x"}
    assert asyncio.run(hook.async_pre_call_hook(None, None, emb, "aembedding")) is emb
