"""LiteLLM: the completion wrappers through the real litellm.completion with its built-in
mock_response (no network; the local cost map), and the proxy pre-call hook."""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace

import pytest

from historygraph import MemoryStore, PolicyError

# slow: importing LiteLLM costs about 4 CPU s in the process that runs these tests (docs/tests.md)
pytestmark = pytest.mark.slow

PLACEHOLDER_ID = re.compile(r"\[tool result (\S+) omitted from this context")
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
    litellm = pytest.importorskip("litellm", reason="litellm not installed (pip install -e '.[litellm]' in the clone)")
    from litellm.integrations.custom_logger import CustomLogger

    from historygraph.integrations import litellm as wrappers

    class Recorder(CustomLogger):
        """Records the messages LiteLLM is about to send."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: list = []

        def log_pre_api_call(self, model, messages, kwargs):
            self.seen.append(messages)

    class Recaller(litellm.CustomLLM):
        """A scripted model behind LiteLLM's custom-provider route (``scripted/...``): it calls the
        recall tool with the id the first placeholder in its input names (taken from the input, not
        from a script) when it was offered the tool and has not recalled yet, else says how many
        lines the latest tool message holds; records the messages and tool names of every call."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: list[list[dict]] = []
            self.tools: list[list[str]] = []

        def completion(self, model, messages, *args, **kwargs):
            tools = [t["function"]["name"] for t in kwargs["optional_params"].get("tools") or []]
            self.seen.append(messages)
            self.tools.append(tools)
            ids = [m.group(1) for x in messages if x["role"] == "tool" and (m := PLACEHOLDER_ID.match(x["content"]))]
            if "historygraph_recall" in tools and messages[-1]["role"] != "tool":
                call = {"id": "r1", "type": "function",
                        "function": {"name": "historygraph_recall", "arguments": json.dumps({"ids": ids[:1]})}}
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
            else:
                message = {"role": "assistant", "content": f"lines seen in full: {messages[-1]['content'].count('line')}"}
            return litellm.ModelResponse(choices=[{"message": message, "finish_reason": "stop"}],
                                         usage=litellm.Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2))

        async def acompletion(self, model, messages, *args, **kwargs):
            return self.completion(model, messages, *args, **kwargs)

    return SimpleNamespace(litellm=litellm, Recorder=Recorder, Recaller=Recaller, completion=wrappers.completion,
                           RECALL_TOOL=wrappers.RECALL_TOOL, recall_results=wrappers.recall_results,
                           acompletion=wrappers.acompletion, HistoryGraphHook=wrappers.HistoryGraphHook,
                           litellm_module=wrappers)


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


def test_without_a_store_the_next_call_extends_what_the_previous_one_sent(ll, recorder):
    """Cache-stable without a store (issue 49; docs/library.md): the conversation's next call, its
    messages the previous ones plus a short answer and question (within B = 500 with what was sent),
    sends the previous call's messages unchanged, then the new ones; a policy instance re-selects."""
    from historygraph import create

    convo = MESSAGES[:5] + [{"role": "user", "content": "Which is longer?"}]
    more = convo + [{"role": "assistant", "content": "big.txt"}, {"role": "user", "content": "And the shorter?"}]
    for policy, kept in (("prune", True), (create("prune"), False)):
        ll.completion(model="gpt-4o-mini", messages=convo, budget=500, policy=policy, mock_response="ok")
        first = [dict(m) for m in recorder.seen[-1]]
        ll.completion(model="gpt-4o-mini", messages=more, budget=500, policy=policy, mock_response="ok")
        assert ([dict(m) for m in recorder.seen[-1][:len(first)]] == first) is kept, policy


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


TURNS = [  # MESSAGES as Anthropic Messages API turns
    {"role": "user", "content": "What is in big.txt and small.txt?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "read", "input": {"path": "big.txt"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": BIG}]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "c2", "name": "read", "input": {"path": "small.txt"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c2", "content": SMALL}]},
    {"role": "user", "content": "Summarise both."},
]
ITEMS = [  # MESSAGES as Responses API input items
    {"role": "user", "content": "What is in big.txt and small.txt?"},
    {"type": "function_call", "call_id": "c1", "name": "read", "arguments": '{"path": "big.txt"}'},
    {"type": "function_call_output", "call_id": "c1", "output": BIG},
    {"type": "function_call", "call_id": "c2", "name": "read", "arguments": '{"path": "small.txt"}'},
    {"type": "function_call_output", "call_id": "c2", "output": SMALL},
    {"role": "user", "content": "Summarise both."},
]


def test_proxy_hook_renders_anthropic_messages_calls(ll):
    """The LiteLLM proxy's /v1/messages route calls the hook with call type anthropic_messages and
    the Anthropic request body (system, messages, metadata)."""
    hook = ll.HistoryGraphHook(budget=500, policy="prune", store=MemoryStore())
    data = {"model": "claude-x", "max_tokens": 100, "system": "You are terse.", "messages": TURNS,
            "metadata": {"user_id": "u1", "historygraph_session": "proxy-a"}}
    out = asyncio.run(hook.async_pre_call_hook(None, None, data, "anthropic_messages"))
    placeholder = out["messages"][2]["content"][0]
    assert placeholder["type"] == "tool_result" and placeholder["tool_use_id"] == "c1"
    assert str(placeholder["content"]).startswith("[tool result c1 omitted from this context (400 tokens)")
    assert out["messages"][4] == TURNS[4] and out["system"] == "You are terse."
    assert out["metadata"] == {"user_id": "u1"}  # Anthropic accepts only user_id there
    assert hook.store.sessions() == ["proxy-a"] and hook.store.graph("proxy-a").result_by_id("c1").content == BIG


def test_proxy_hook_renders_responses_calls_but_not_provider_kept_state(ll):
    hook = ll.HistoryGraphHook(budget=500, policy="prune", store=MemoryStore())
    data = {"model": "gpt-4o-mini", "instructions": "You are terse.", "input": ITEMS,
            "litellm_metadata": {"historygraph_session": "proxy-r"}}
    out = asyncio.run(hook.async_pre_call_hook(None, None, data, "aresponses"))
    assert out["input"][2] == {"type": "function_call_output", "call_id": "c1", "output": out["input"][2]["output"]}
    assert out["input"][2]["output"].startswith("[tool result c1 omitted from this context (400 tokens)")
    assert out["input"][4] is ITEMS[4] and out["instructions"] == "You are terse."
    assert hook.store.sessions() == ["proxy-r"]
    chained = {"model": "gpt-4o-mini", "input": ITEMS, "previous_response_id": "resp_1"}
    assert asyncio.run(hook.async_pre_call_hook(None, None, chained, "aresponses")) is chained


def test_a_call_the_proxy_made_is_not_rendered_again_before_it_is_sent(ll):
    hook = ll.HistoryGraphHook(budget=500, policy="prune", store=MemoryStore())
    kwargs = {"model": "gpt-4o-mini", "messages": MESSAGES, "proxy_server_request": {"url": "/v1/chat/completions"}}
    assert asyncio.run(hook.async_pre_call_deployment_hook(kwargs, ll.litellm.types.utils.CallTypes.acompletion)) is None
    assert hook.store.sessions() == []


@pytest.fixture
def registered(ll):
    """A HistoryGraphHook in litellm.callbacks (the SDK's callback list) and a scripted model."""
    hook, model = ll.HistoryGraphHook(budget=500, policy="prune", store=MemoryStore()), ll.Recaller()
    before = ll.litellm.callbacks, ll.litellm.custom_provider_map
    ll.litellm.callbacks = [hook]
    ll.litellm.custom_provider_map = [{"provider": "scripted", "custom_handler": model}]
    yield hook, model
    ll.litellm.callbacks, ll.litellm.custom_provider_map = before


def test_registered_in_litellm_callbacks_it_renders_sdk_chat_calls(ll, registered):
    hook, model = registered
    reply = asyncio.run(ll.litellm.acompletion(model="scripted/m", messages=MESSAGES, metadata={"historygraph_session": "sdk-c"}))
    assert reply.choices[0].message.content == "lines seen in full: 0"  # the latest message is the user's
    sent = model.seen[-1]
    assert sent[2]["content"].startswith("[tool result c1 omitted from this context (400 tokens)")
    assert sent[4]["content"] == SMALL
    assert hook.store.sessions() == ["sdk-c"] and hook.store.graph("sdk-c").result_by_id("c1").content == BIG


def test_registered_in_litellm_callbacks_it_renders_sdk_responses_and_messages_calls_once(ll, registered):
    """aresponses and anthropic.messages.acreate to a chat-only provider are carried out by an
    inner chat call, which the hook must not render again (that would store the placeholders as
    the conversation: a second, branched session)."""
    hook, model = registered
    asyncio.run(ll.litellm.aresponses(model="scripted/m", input=ITEMS, instructions="You are terse.",
                                      metadata={"historygraph_session": "sdk-r"}))
    sent = model.seen[-1]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "tool", "user"]
    assert sent[3]["content"].startswith("[tool result c1 omitted from this context (400 tokens)")
    assert sent[5]["content"] == SMALL
    asyncio.run(ll.litellm.anthropic.messages.acreate(model="scripted/m", messages=TURNS, max_tokens=100,
                                                      metadata={"historygraph_session": "sdk-a"}))
    sent = model.seen[-1]
    tool = [m for m in sent if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool] == ["c1", "c2"]
    assert str(tool[0]["content"]).startswith("[tool result c1 omitted from this context (400 tokens)")
    assert sorted(hook.store.sessions()) == ["sdk-a", "sdk-r"]  # nothing rendered twice: no third session
    assert hook.store.graph("sdk-r").result_by_id("c1").content == BIG == hook.store.graph("sdk-a").result_by_id("c1").content


def test_a_sync_completion_the_hook_cannot_render_is_said_once(ll, registered):
    """Issue 50: the hook silently did nothing for the synchronous litellm.completion (LiteLLM runs
    no pre-call hook for it) and under mock_response. Now a sync call warns, once per hook, before it
    is sent where LiteLLM logs a pre-call (mock_response here), else after it (a custom provider);
    completion(), which renders first, does not warn; an async call under mock_response is rendered."""
    import time
    import warnings

    hook, model = registered
    with pytest.warns(RuntimeWarning, match="did not render a synchronous litellm.completion") as caught:
        ll.litellm.completion(model="gpt-4o-mini", messages=MESSAGES, mock_response="ok")
    assert "litellm.acompletion" in str(caught[0].message) and hook.warned_sync
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        ll.litellm.completion(model="gpt-4o-mini", messages=MESSAGES, mock_response="ok")
        ll.completion(model="scripted/m", messages=MESSAGES, budget=500, policy="prune")  # renders itself: no warning
        fresh = ll.HistoryGraphHook(budget=500, policy="prune", store=MemoryStore())
        ll.litellm.callbacks = [fresh]
        ll.completion(model="scripted/m", messages=MESSAGES, budget=500, policy="prune")
        time.sleep(0.5)  # a custom provider's calls are reported after the call, from LiteLLM's logging thread
        assert not fresh.warned_sync
        ll.litellm.completion(model="scripted/m", messages=MESSAGES)
        for _ in range(100):
            if fresh.warned_sync:
                break
            time.sleep(0.05)
    assert fresh.warned_sync and "omitted" not in model.seen[-1][2]["content"]  # sent whole, and said so
    assert [str(w.message) for w in again if w.category is RuntimeWarning] == [ll.litellm_module.SYNC_WARNING]
    ll.litellm.callbacks = [hook]
    asyncio.run(ll.litellm.acompletion(model="gpt-4o-mini", messages=MESSAGES, mock_response="ok",
                                       metadata={"historygraph_session": "mock-a"}))
    assert hook.store.sessions() == ["mock-a"]  # rendered (and stored) under mock_response too


@pytest.fixture
def recaller(ll):
    model, before = ll.Recaller(), ll.litellm.custom_provider_map
    ll.litellm.custom_provider_map = [{"provider": "scripted", "custom_handler": model}]
    yield model
    ll.litellm.custom_provider_map = before


def test_the_model_recalls_an_omitted_result_by_the_id_its_placeholder_names(ll, recaller):
    store, messages = MemoryStore(), list(MESSAGES)
    args = {"model": "scripted/recaller", "tools": [ll.RECALL_TOOL], "budget": 500, "policy": "prune",
            "session": "ll-r", "store": store}
    reply = ll.completion(messages=messages, **args)
    assert recaller.seen[0][2]["content"].startswith("[tool result c1 omitted from this context (400 tokens)")
    message = reply.choices[0].message
    answers = ll.recall_results(message, session="ll-r", store=store)
    assert answers == [{"role": "tool", "tool_call_id": "r1", "content": BIG}]  # the complete result
    messages += [message.model_dump(), *answers]
    reply = ll.completion(messages=messages, **args)
    assert recaller.seen[1][-1]["content"] == BIG  # the model is sent the recalled result whole
    assert reply.choices[0].message.content == "lines seen in full: 200"
    assert recaller.tools == [["historygraph_recall"]] * 2


def test_recall_results_answers_only_recall_calls(ll):
    store = MemoryStore()
    ll.completion(model="gpt-4o-mini", messages=MESSAGES, budget=500, policy="prune", session="ll-2", store=store,
                  mock_response="ok")
    calls = [{"id": "x", "type": "function", "function": {"name": "read", "arguments": "{}"}},
             {"id": "y", "type": "function", "function": {"name": "historygraph_recall", "arguments": "oops"}}]
    answers = ll.recall_results({"role": "assistant", "content": None, "tool_calls": calls}, session="ll-2", store=store)
    assert [a["tool_call_id"] for a in answers] == ["y"] and answers[0]["content"].startswith('[historygraph_recall: pass {"ids"')
    assert ll.recall_results({"role": "assistant", "content": "done"}, session="ll-2", store=store) == []
