"""The proxy's Responses API, count_tokens, unknown routes, forwarding over B and tool-loop text
blocks, end to end (issue 36.1–3): the official openai and anthropic clients talk to
``historygraph serve`` (a real process) in front of the rule-enforcing fake provider (another)."""

from __future__ import annotations

import json

import httpx
import pytest

from historygraph import Message, TokenCounter

from fake_responses import seal
from fake_upstream import sign
from test_server import FAKE, KEY, TOKEN, _port, _start

BUDGET = 800
WORDS = 200  # an output of about 400 tokens: the newest fits in B, two do not
FN_TOOLS = [{"type": "function", "name": "search", "description": "find", "parameters": {"type": "object", "properties": {}}}]
A_TOOLS = [{"name": "search", "description": "find", "input_schema": {"type": "object", "properties": {}}}]
counter = TokenCounter()
pytestmark = pytest.mark.slow  # two server processes per module


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("responses")
    up_port, px_port = _port(), _port()
    up = _start([FAKE, "--port", str(up_port)], up_port, tmp / "upstream.log")
    px = _start(["-m", "historygraph", "serve", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--anthropic-upstream",
                 f"http://127.0.0.1:{up_port}", "--port", str(px_port), "--store", str(tmp / "proxy.sqlite"),
                 "--policy", "prune", "--budget", str(BUDGET), "--auth-token", TOKEN], px_port, tmp / "proxy.log")
    yield {"up": f"http://127.0.0.1:{up_port}", "px": f"http://127.0.0.1:{px_port}", "log": tmp / "proxy.log"}
    for p in (px, up):
        p.terminate()
        p.wait(10)


def received(servers) -> dict:
    return httpx.get(servers["up"] + "/_requests").json()[-1]


def rejections(servers) -> list:
    return httpx.get(servers["up"] + "/_rejections").json()


def stored(servers, sid: str) -> list[dict]:
    r = httpx.get(f"{servers['px']}/api/sessions/{sid}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return [{k: v for k, v in m.items() if k != "timestamp"} for m in r.json()["messages"]]  # without the time received


def metric(servers, name: str) -> float:
    for line in httpx.get(servers["px"] + "/metrics").text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def client(servers, sid: str, **headers):
    import openai

    return openai.OpenAI(base_url=servers["px"] + "/v1", api_key=KEY, max_retries=0,
                         default_headers={"X-HistoryGraph-Session": sid, **headers})


def items(tag: str, n: int = 3) -> list[dict]:
    """A task, then n steps (reasoning the fake sealed, a function call, a ~400-token output), then a question."""
    out: list[dict] = [{"role": "user", "content": f"task {tag}"}]
    for i in range(n):
        out += [{"type": "reasoning", "id": f"rs_{tag}{i}", "summary": [{"type": "summary_text", "text": f"plan {i} ✓"}],
                 "encrypted_content": seal(f"plan {i} ✓")},
                {"type": "function_call", "id": f"fc_{tag}{i}", "call_id": f"{tag}c{i}", "name": "search", "arguments": f'{{"i": {i}}}'},
                {"type": "function_call_output", "call_id": f"{tag}c{i}", "output": f"result{i} " * WORDS}]
    out.append({"role": "user", "content": "and now?"})
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_responses_rendered_under_budget_reasoning_byte_exact_answer_stored(servers, stream):
    sid = f"resp-{stream}"
    sent_items = items(sid)
    kw = dict(model="fake-model", instructions="Be brief.", input=sent_items, tools=FN_TOOLS, tool_choice="auto", store=False)
    if stream:
        events = list(client(servers, sid).responses.create(**kw, stream=True))
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.function_call_arguments.delta" in kinds and "response.output_item.done" in kinds
        output = events[-1].response.output
    else:
        output = client(servers, sid).responses.create(**kw).output
    assert [o.type for o in output] == ["reasoning", "function_call"]
    body = received(servers)["body"]
    assert body["instructions"] == "Be brief." and body["tools"] == FN_TOOLS and body["store"] is False
    forwarded = body["input"]
    # cache-stable rendering (the proxy's default) re-selects at 0.75·B = 600 tokens: prune drops step 0
    # (messages #2–#3) behind a dropped-step marker and keeps step 1 behind a placeholder
    assert forwarded[1] == {"role": "user", "content": "[omitted: messages #2\u2013#3, tool calls: 1; stored in full, restore by message number]"}
    assert [it for it in forwarded if it.get("type") == "reasoning"] == [sent_items[4], sent_items[7]]
    outputs = [it for it in forwarded if it.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [f"{sid}c1", f"{sid}c2"]
    assert outputs[1]["output"] == "result2 " * WORDS  # the newest, complete
    assert outputs[0]["output"].startswith(f"[tool result {sid}c1 omitted")
    assert rejections(servers) == []
    history = stored(servers, sid)
    assert history[0] == {"role": "system", "content": "Be brief."}
    call = output[1]
    assert history[-1]["tool_calls"] == [{"id": call.call_id, "type": "function",
                                          "function": {"name": "search", "arguments": call.arguments}}]
    # the complete output stays retrievable by id
    r = httpx.get(f"{servers['px']}/api/sessions/{sid}/results/{sid}c0", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.json()["content"] == "result0 " * WORDS


def test_continuing_with_the_echoed_answer_stores_only_the_new_items(servers):
    sid = "resp-continue"
    c = client(servers, sid)
    first = c.responses.create(model="m", input=[{"role": "user", "content": "go"}], tools=FN_TOOLS)
    n_before = len(stored(servers, sid))
    # echoed as clients do, with or without the ids and statuses the response had
    echoed = [{k: v for k, v in o.model_dump(exclude_none=True).items() if k not in ("id", "status")} for o in first.output]
    call_id = echoed[-1]["call_id"]
    second = c.responses.create(model="m", tools=FN_TOOLS, input=[
        {"role": "user", "content": "go"}, *echoed, {"type": "function_call_output", "call_id": call_id, "output": "42"}])
    assert second.output[-1].type == "message" and rejections(servers) == []
    history = stored(servers, sid)
    assert n_before == 2 and len(history) == 4  # user, answer | result, answer: no branch
    assert history[2] == {"role": "tool", "tool_call_id": call_id, "content": "42"}


def test_previous_response_id_passes_through_unchanged_and_says_so(servers):
    raw = b'{"model":"m","previous_response_id":"resp_x","input":[{"type":"function_call_output","call_id":"cX","output":"1"}]}'
    r = httpx.post(servers["px"] + "/v1/responses", content=raw, headers={"Authorization": f"Bearer {KEY}",
                                                                           "content-type": "application/json"})
    assert r.status_code == 200 and r.headers["x-historygraph-passthrough"] == "previous_response_id"
    assert received(servers)["body"] == json.loads(raw)
    assert "x-historygraph-session" not in r.headers
    assert "passthrough" in servers["log"].read_text()


def test_responses_usage_reaches_the_calibration(servers):
    before = httpx.get(servers["px"] + "/api/calibration", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    client(servers, "resp-usage").responses.create(model="m", input="usage please")
    after = httpx.get(servers["px"] + "/api/calibration", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert after["observations"] == before["observations"] + 1
    # the fake reports 3 input tokens, 2 of them cached
    assert after["input_tokens"]["fresh"] == before["input_tokens"]["fresh"] + 1
    assert after["input_tokens"]["cache_read"] == before["input_tokens"]["cache_read"] + 2
    assert metric(servers, 'historygraph_requests_total{api="responses",status="200"}') >= 1


@pytest.mark.parametrize("headers, body", [
    ({}, {"error": {"message": None, "type": "invalid_request_error", "param": None, "code": "unknown_url"}}),
    ({"anthropic-version": "2023-06-01"}, {"type": "error", "error": {"type": "not_found_error", "message": None}}),
])
def test_unknown_routes_answer_in_the_provider_error_shape(servers, headers, body):
    r = httpx.post(servers["px"] + "/v1/embeddingz", json={}, headers=headers)
    got = r.json()
    inner = got["error"]
    assert r.status_code == 404 and "POST /v1/embeddingz" in inner["message"]
    inner["message"] = None
    assert got == body
    assert httpx.get(servers["px"] + "/nowhere").json() == {"detail": "Not Found"}  # outside /v1/: FastAPI's


def test_models_of_an_anthropic_client_come_from_the_anthropic_upstream(servers):
    import anthropic

    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0)
    assert [m.id for m in a.models.list().data] == ["fake-claude"]
    assert [m.id for m in client(servers, "x").models.list().data] == ["fake-model"]


def test_count_tokens_counts_the_request_as_forwarded(servers):
    import anthropic

    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0)
    n = a.messages.count_tokens(model="m", system="Be brief.", messages=[{"role": "user", "content": "hello world"}])
    # o200k: "Be brief." 3 tokens + 3 per message, "hello world" 2 + 3, reply priming 3
    assert n.input_tokens == 3 + 3 + 2 + 3 + 3
    turns = [{"role": "user", "content": "task"}]
    for i in range(3):
        turns += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"k{i}", "name": "search", "input": {}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"k{i}", "content": f"r{i} " * WORDS}]}]
    whole = counter.count_messages([Message("user", "task")]) + 3 * counter.count("r0 " * WORDS)
    rendered = a.messages.count_tokens(model="m", messages=turns).input_tokens
    assert rendered < whole  # two of the three ~400-token results do not fit in B = 800
    unrendered = a.messages.count_tokens(model="m", messages=turns, extra_headers={"X-HistoryGraph-Budget": "100000"})
    assert unrendered.input_tokens > whole


def test_over_budget_forwards_the_smallest_valid_rendering_and_says_so(servers):
    """Issue 36.3: the loop's opening turn (thinking, a large tool input) does not fit in B = 200."""
    import anthropic

    think = {"type": "thinking", "thinking": "plan ✓", "signature": sign("plan ✓")}
    turns = [{"role": "user", "content": "find the bug (over B)"},
             {"role": "assistant", "content": [think, {"type": "tool_use", "id": "ob0", "name": "search",
                                                       "input": {"script": "echo x " * 300}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "ob0", "content": "out " * WORDS}]}]
    before = metric(servers, 'historygraph_over_budget_total{policy="prune"}')
    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0,
                            default_headers={"X-HistoryGraph-Session": "over-b", "X-HistoryGraph-Budget": "200"})
    raw = a.messages.with_raw_response.create(model="m", max_tokens=20, messages=turns, tools=A_TOOLS)
    assert raw.http_response.status_code == 200
    over = int(raw.headers["x-historygraph-over-budget"])
    sent = received(servers)["body"]["messages"]
    assert sent[1] == turns[1] and rejections(servers) == []
    assert over > 605  # the opening turn's tool input alone: 605 tokens (o200k, its JSON text)
    assert metric(servers, 'historygraph_over_budget_total{policy="prune"}') == before + 1
    assert "over budget" in servers["log"].read_text()


def test_tool_loaded_text_after_a_result_is_no_new_user_turn(servers):
    """Claude Code's deferred-tool load: a text block after the tool_result in the same user turn."""
    import anthropic

    turns = [{"role": "user", "content": "task: load the tool"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "tl0", "name": "search", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tl0", "content": "ok"},
                                          {"type": "text", "text": "Tool loaded."}]}]
    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0,
                            default_headers={"X-HistoryGraph-Session": "tool-loaded"})
    a.messages.create(model="m", max_tokens=20, messages=turns, tools=A_TOOLS)
    sent = received(servers)["body"]
    # as sent, plus the proxy's cache breakpoints: the last block of the last message, the opening, the last tool
    loaded = {"type": "text", "text": "Tool loaded.", "cache_control": {"type": "ephemeral"}}
    opening = {"role": "user", "content": [{"type": "text", "text": "task: load the tool", "cache_control": {"type": "ephemeral"}}]}
    assert sent["messages"] == [opening, turns[1], {"role": "user", "content": [turns[2]["content"][0], loaded]}]
    assert sent["tools"] == [{**A_TOOLS[-1], "cache_control": {"type": "ephemeral"}}] and rejections(servers) == []
    history = stored(servers, "tool-loaded")
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[2]["provider_blocks"] == '[{"text":"Tool loaded.","type":"text"}]'


def test_a_system_turn_inside_messages_is_kept_at_its_place_outside_b(servers):
    """Claude Code 2.1's environment block: a ``{"role": "system"}`` turn after the first user
    message, in every request. Converted to a system message (outside B, never dropped) and
    forwarded as the client sent it, at its place, while older results are left out for B."""
    import anthropic

    env = {"role": "system", "content": [{"type": "text", "text": "<env>\n" + "Working directory: /work/repo\n" * 60 + "</env>",
                                          "cache_control": {"type": "ephemeral"}}]}
    turns: list[dict] = [{"role": "user", "content": "task: system turn"}, env]
    for i in range(3):
        turns += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"st{i}", "name": "search", "input": {"i": i}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"st{i}", "content": f"out{i} " * WORDS}]}]
    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0,
                            default_headers={"X-HistoryGraph-Session": "system-turn"})
    raw = a.messages.with_raw_response.create(model="m", max_tokens=20, messages=turns, tools=A_TOOLS)
    assert raw.http_response.status_code == 200 and "x-historygraph-over-budget" not in raw.headers
    sent = received(servers)["body"]["messages"]
    opening = {"role": "user", "content": [{"type": "text", "text": "task: system turn", "cache_control": {"type": "ephemeral"}}]}
    assert sent[:3] == [opening, *turns[1:3]] and rejections(servers) == []  # with the proxy's breakpoint on the opening
    results = [b for m in sent if isinstance(m["content"], list) for b in m["content"] if b.get("type") == "tool_result"]
    assert results[0]["content"].startswith("[tool result st0 omitted") and results[2]["content"] == "out2 " * WORDS
    history = stored(servers, "system-turn")
    assert [m["role"] for m in history][:4] == ["user", "system", "assistant", "tool"]
    assert history[1]["content"] == env["content"][0]["text"]


def test_a_responses_stream_cut_mid_way_ends_with_an_error_event(servers):
    with httpx.stream("POST", servers["px"] + "/v1/responses", headers={"X-HistoryGraph-Session": "resp-cut"},
                      json={"model": "cut-model", "input": "go", "stream": True}) as r:
        text = r.read().decode()
    last = text.strip().split("\n\n")[-1]
    assert last.startswith("event: error\ndata: ")
    assert json.loads(last.split("data: ", 1)[1])["code"] == "upstream_stream_cut"
    assert [m["role"] for m in stored(servers, "resp-cut")] == ["user"]  # no partial answer in the history


def test_responses_errors_upstream_unchanged_and_bad_input_named(servers):
    import openai

    with pytest.raises(openai.RateLimitError) as info:
        client(servers, "resp-err").responses.create(model="error-model", input="hi")
    assert info.value.body["code"] == "rate_limited"  # the fake's own error body
    r = httpx.post(servers["px"] + "/v1/responses", json={"model": "m", "input": [{"type": "function_call_output", "output": "x"}]})
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "input[0].call_id is missing", "type": "invalid_request_error",
                                 "param": "input", "code": None}


@pytest.mark.parametrize("stream", [False, True])
def test_the_recall_tool_is_offered_and_answered_on_responses(servers, stream):
    """``X-HistoryGraph-Recall: on``: the rendering omitted outputs, so the proxy offers its tool in
    the Responses function-tool shape; the fake calls it (the only tool offered), the proxy answers
    the call with a ``function_call_output`` after the model's reasoning and call items (the fake
    enforces the API's pairing and reasoning rules), and the client gets only the final answer."""
    sid = f"resp-recall-{stream}"
    before = len(httpx.get(servers["up"] + "/_requests").json())
    kw = dict(model="fake-model", input=items(sid), store=False)
    c = client(servers, sid, **{"X-HistoryGraph-Recall": "on"})
    if stream:
        events = list(c.responses.create(**kw, stream=True))
        assert events[-1].type == "response.completed"
        output = events[-1].response.output
    else:
        output = c.responses.create(**kw).output
    sent = httpx.get(servers["up"] + "/_requests").json()[before:]
    assert rejections(servers) == [] and len(sent) == 2
    first, second = sent[0]["body"], sent[1]["body"]
    assert [(t["type"], t["name"], sorted(t)) for t in first["tools"]] == [
        ("function", "historygraph_recall", ["description", "name", "parameters", "type"])]
    call = [it for it in second["input"] if it.get("name") == "historygraph_recall"]
    assert len(call) == 1 and second["input"][-1]["type"] == "function_call_output"
    assert second["input"][-1]["call_id"] == call[0]["call_id"] and second["input"][-2] == call[0]
    assert [o.type for o in output] == ["reasoning", "message"] and "historygraph_recall" not in json.dumps([o.model_dump() for o in output])
    assert stored(servers, sid)[-1]["content"] == output[-1].content[0].text
