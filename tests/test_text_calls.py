"""Clients that restate their tool calls as text (historygraph.providers.text_calls; issue 50):
smolagents' ToolCallingAgent through the proxy is one session rendered under B, and what is
forwarded keeps smolagents' own messages.

The requests are shaped exactly as smolagents 1.26.0 (``ToolCallingAgent`` + ``OpenAIServerModel``)
sends them, as recorded from a run against a recording server: content as lists of text parts;
an answer that called a tool echoed as ``Calling tools:\\n`` and Python's ``str`` of
``[{'id', 'type': 'function', 'function': {'name', 'arguments': <parsed>}}]`` (``ActionStep.
to_messages``, ``ToolCall.dict``), its output as the user message ``Observation:\\n<output>``
(role ``tool-response`` mapped to ``user``), ``stop`` and ``tool_choice: required``."""

from __future__ import annotations

import re

import asyncio
import json

import httpx

from fake_scripts import command, expected_output
from historygraph import Message
from historygraph.providers import text_calls
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.signals.tokens import TokenCounter

SYSTEM = "You are an expert assistant who can solve any task using tool calls. You will be given a task to solve as best you can."
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string", "description": "the command"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "final_answer", "description": "Provides a final answer to the given problem.",
                                      "parameters": {"type": "object", "properties": {"answer": {"type": "string", "description": "The final answer to the problem"}}, "required": ["answer"]}}}]
STEPS = 24  # then final_answer: 25 requests, as in the run


def parts(text: str) -> list[dict]:
    return [{"type": "text", "text": text}]


def echo(call: dict) -> dict:
    """smolagents' memory of an answer that made ``call`` (a Chat Completions tool call)."""
    listed = [{"id": call["id"], "type": "function", "function": {"name": call["function"]["name"],
                                                                 "arguments": json.loads(call["function"]["arguments"])}}]
    return {"role": "assistant", "content": parts("Calling tools:\n" + str(listed))}


def request(answers: list[dict]) -> dict:
    """The request smolagents sends after the answers so far (each one call, each run)."""
    messages = [{"role": "system", "content": parts(SYSTEM)}, {"role": "user", "content": parts("New task:\nRun the numbered steps.")}]
    for k, call in enumerate(answers, 1):
        messages += [echo(call), {"role": "user", "content": parts("Observation:\n" + expected_output(k))}]
    return {"model": "m", "messages": messages, "stop": ["Observation:", "Calling tools:"], "tool_choice": "required", "tools": TOOLS}


def test_a_smolagents_run_is_one_session_rendered_under_b_in_smolagents_own_messages():
    forwarded: list[dict] = []

    def upstream(req: httpx.Request) -> httpx.Response:
        forwarded.append(json.loads(req.content))
        k = len(forwarded)
        name, args = ("bash", {"command": command(k)}) if k <= STEPS else ("final_answer", {"answer": "done"})
        msg = {"role": "assistant", "content": None,
               "tool_calls": [{"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": "m", "created": 0,
                                         "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls"}]})

    app = create_app(ServerConfig(upstream="http://upstream/v1", store=":memory:", policy="learned", budget=3000, calibrate=False))
    app.state.proxy.transport = httpx.MockTransport(upstream)
    sent: list[dict] = []

    async def run() -> list[httpx.Response]:
        out, answers = [], []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            for _ in range(STEPS + 1):
                sent.append(request(answers))
                r = await c.post("/v1/chat/completions", json=sent[-1])
                out.append(r)
                answers.append(r.json()["choices"][0]["message"]["tool_calls"][0])
        return out

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 25
    sessions = {r.headers["x-historygraph-session"] for r in responses}
    assert len(sessions) == 1 and "~" not in next(iter(sessions)) and "." not in next(iter(sessions))  # one session, no branch
    assert not any("x-historygraph-context" in r.headers for r in responses)  # rendered, not forwarded as sent
    stored = app.state.proxy.store.messages(next(iter(sessions)))
    # system, task, then each step's call and its output once, and the final answer: 2 + 2 × 24 + 1
    assert len(stored) == 51 and app.state.proxy.store.sessions() == list(sessions)
    assert [(m.role, [c.id for c in m.tool_calls], m.tool_call_id) for m in stored[2:6]] == [
        ("assistant", ["call_1"], None), ("tool", [], "call_1"), ("assistant", ["call_2"], None), ("tool", [], "call_2")]
    assert stored[3].content == "Observation:\n" + expected_output(1)
    counter = TokenCounter()
    for n, (body, client) in enumerate(zip(forwarded, sent)):
        msgs = body["messages"]
        # smolagents' own representation: no tool role, no tool_calls; the newest call and output as sent
        assert all(m["role"] in ("system", "user", "assistant") and "tool_calls" not in m for m in msgs), n
        assert msgs[:2] == client["messages"][:2] and msgs[-2:] == client["messages"][-2:]
        assert {k: v for k, v in body.items() if k != "messages"} == {k: v for k, v in client.items() if k != "messages"}
        # the history forwarded (all but the system prompt and the task), counted as sent, is within B
        assert counter.count_messages([Message.from_openai(m) for m in msgs[2:]]) <= 3000, n
    client_history = counter.count_messages([Message.from_openai(m) for m in sent[-1]["messages"][2:]])
    assert client_history > 3 * 3000  # what smolagents sent: its whole history, B would have been ignored
    # the oldest steps are left out behind a marker naming them (a user message, as smolagents' own); of
    # the agent's newest steps, shown with their calls (invariant 10), the outputs not selected are short
    # placeholders naming their ids, in smolagents' own form too
    strings = [m["content"] for m in forwarded[-1]["messages"] if isinstance(m["content"], str)]
    assert strings[0][:23] == "[omitted: messages #2–#"
    assert all(re.fullmatch(r"\[tool result call_\d+ omitted; restore by id\]", s) for s in strings[1:]), strings


def test_an_echo_is_read_as_its_call_and_the_output_as_its_result():
    counter = TokenCounter()
    call = {"id": "call_7", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    with_text = {"role": "assistant", "content": parts("I will list.\nCalling tools:\n[{'id': 'call_7', 'type': 'function', "
                                                      "'function': {'name': 'bash', 'arguments': {'command': 'ls'}}}]")}
    raw = [{"role": "user", "content": "go"}, echo(call), {"role": "user", "content": parts("Observation:\na.txt")}, with_text,
           {"role": "user", "content": "Observation:\nb.txt"}]
    found = text_calls.read(raw, counter.count_message)
    assert found is not None and sorted(found.events) == [1, 2]  # call_7 again at 3 is no new call: left as text
    assert found.events[1] == Message("assistant", "", (text_calls.ToolCall("call_7", "bash", '{"command": "ls"}'),))
    assert found.events[2] == Message("tool", "Observation:\na.txt", tool_call_id="call_7")
    framing = counter.count_message(Message.from_openai(echo(call))) - counter.count_message(found.events[1])
    assert found.framing == framing > 0
    # a placeholder and a brief view go back in smolagents' form
    assert text_calls.client_form(Message("tool", "[omitted call_7]", tool_call_id="call_7", rendered_as="placeholder"), found) == {
        "role": "user", "content": "[omitted call_7]"}
    assert text_calls.client_form(Message("assistant", "[brief]", found.events[1].tool_calls, rendered_as="brief"), found) == {
        "role": "assistant", "content": "[brief]\nCalling tools:\n[{'id': 'call_7', 'type': 'function', 'function': "
                                        "{'name': 'bash', 'arguments': {'command': 'ls'}}}]"}
    two = {"role": "assistant", "content": "Calling tools:\n[{'id': 'a', 'type': 'function', 'function': {'name': 'x', 'arguments': {}}}, "
                                           "{'id': 'b', 'type': 'function', 'function': {'name': 'x', 'arguments': {}}}]"}
    for text in (two, {"role": "assistant", "content": "Calling tools:\n[not a literal"}, {"role": "assistant", "content": "hello"}):
        assert text_calls.read([text, {"role": "user", "content": "Observation:\n1"}], counter.count_message) is None
