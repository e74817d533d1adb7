"""Token calibration against provider-reported usage; values by hand."""

import json

from historygraph.history.events import Message
from historygraph.signals.calibration import REPLY_PRIMING, TokenCalibration
from historygraph.signals.tokens import TokenCounter


def test_estimate_counts_messages_tools_and_priming():
    c = TokenCounter()
    cal = TokenCalibration(c)
    msgs = [Message("system", "be brief"), Message("user", "hello world")]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    expected = c.count_message(msgs[0]) + c.count_message(msgs[1]) + REPLY_PRIMING + \
        c.count(json.dumps(tools, separators=(",", ":")))
    assert cal.estimate_request(msgs, tools) == expected


def test_ratio_and_adjusted_budget():
    cal = TokenCalibration(TokenCounter())
    assert cal.ratio == 1.0 and cal.adjusted_budget(6000) == 6000
    for est, rep in [(100, 110), (200, 240), (100, 105)]:  # ratios 1.10, 1.20, 1.05 -> median 1.10
        cal.observe(est, rep)
    assert abs(cal.ratio - 1.10) < 1e-9
    assert cal.adjusted_budget(6000) == 5454  # floor(6000 / 1.1)
    assert cal.summary() == {"observations": 3, "median_ratio": 1.1, "max_abs_error": 40,
                             "input_tokens": {"fresh": 455, "cache_read": 0, "cache_write": 0}}
    cal2 = TokenCalibration(TokenCounter())
    cal2.observe(100, 80)  # provider counts fewer: the budget is never grown
    assert cal2.adjusted_budget(6000) == 6000


def test_ratio_is_the_median_of_the_window_as_it_slides():
    """The median read from the ratios kept sorted equals ``statistics.median`` of the window's
    pairs after every observation, odd and even counts, repeated ratios and the oldest leaving."""
    import random
    import statistics

    rng = random.Random(13)
    cal = TokenCalibration(TokenCounter(), window=6)
    pairs = []
    for _ in range(60):
        est, rep = rng.randint(50, 60), rng.randint(50, 70)
        cal.observe(est, rep)
        pairs = (pairs + [(est, rep)])[-6:]
        assert cal.ratio == statistics.median(r / e for e, r in pairs)
    assert cal.summary()["observations"] == 6


def test_usage_of_every_answer_shape_keeps_fresh_cache_read_and_cache_write_apart():
    from historygraph.providers.anthropic import StreamAccumulator
    from historygraph.server.upstream import OpenAIStreamAccumulator
    from historygraph.signals.calibration import Usage, anthropic_usage, openai_usage
    assert openai_usage({"usage": {"prompt_tokens": 1200, "prompt_tokens_details": {"cached_tokens": 1024}}}) == Usage(176, 1024, 0)
    acc = OpenAIStreamAccumulator()  # the include_usage chunk: no choices, usage only
    for ev in [{"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]},
               {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 2}}, "[DONE]"]:
        acc.feed(ev)
    assert acc.usage == Usage(50)
    body = {"usage": {"input_tokens": 20, "cache_read_input_tokens": 3000, "cache_creation_input_tokens": 500}}
    assert anthropic_usage(body) == Usage(20, 3000, 500) and anthropic_usage(body).total == 3520
    sacc = StreamAccumulator()
    sacc.feed({"type": "message_start", "message": {"usage": {"input_tokens": 7, "cache_read_input_tokens": 100,
                                                               "cache_creation_input_tokens": 0, "output_tokens": 1}}})
    sacc.feed({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 9}})
    assert sacc.usage == Usage(7, 100, 0)
    cal = TokenCalibration(TokenCounter())
    cal.observe(100, Usage(20, 70, 30))
    assert cal.summary()["input_tokens"] == {"fresh": 20, "cache_read": 70, "cache_write": 30} and cal.ratio == 1.2


def test_the_proxy_renders_at_the_calibrated_budget_unless_turned_off():
    from historygraph.server.config import ServerConfig
    from historygraph.server.proxy import Proxy
    from historygraph.history.events import ToolCall
    msgs = [Message("user", "task")] + [m for i in range(6) for m in (
        Message("assistant", "", (ToolCall(f"c{i}", "bash", "{}"),)), Message("tool", "out " * 300, tool_call_id=f"c{i}"))]
    msgs.append(Message("user", "next"))
    for calibrate, expected in [(True, 500), (False, 1000)]:
        proxy = Proxy(ServerConfig(store=":memory:", policy="prune", calibrate=calibrate))
        proxy.calibration.observe(100, 200)  # the provider counts twice what we do
        _, r, _, _ = proxy.prepare(msgs, "cal", "prune", 1000)
        assert r.budget == expected and r.history_tokens <= expected


def test_the_proxy_estimates_what_it_forwarded_for_either_api():
    # the proxy reuses the rendering's recounted history tokens (outside_tokens adds the system
    # and latest user messages): the estimate must equal a count of the forwarded body itself
    import asyncio

    import httpx

    from historygraph.providers import anthropic as anth
    from historygraph.server.app import create_app
    from historygraph.server.config import ServerConfig

    app = create_app(ServerConfig(store=":memory:", policy="prune", budget=300))
    proxy = app.state.proxy
    forwarded: list[dict] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        forwarded.append(body)
        usage = {"prompt_tokens": 1000, "completion_tokens": 1}
        if request.url.path.endswith("/messages"):
            return httpx.Response(200, json={"id": "m", "type": "message", "role": "assistant", "model": "m",
                                             "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                                             "usage": {"input_tokens": 1000, "output_tokens": 1}})
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "model": "m", "usage": usage,
                                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                      "finish_reason": "stop"}]})

    proxy.transport = httpx.MockTransport(upstream)
    steps = []
    for i in range(6):  # over B = 300: older results become placeholders
        steps += [{"role": "assistant", "content": f"step {i}", "tool_calls": [
                      {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i} of the output\n" * 40}]
    openai_msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix the bug"}, *steps,
                   {"role": "system", "content": "a late note"}, {"role": "user", "content": "and now?"}]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    anthropic_turns = [{"role": "user", "content": "fix the bug"}]
    for i in range(6):
        anthropic_turns += [{"role": "assistant", "content": [{"type": "text", "text": f"step {i}"},
                                                              {"type": "tool_use", "id": f"t{i}", "name": "bash", "input": {}}]},
                            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                                          "content": f"line {i} of the output\n" * 40}]}]
    anthropic_turns.append({"role": "user", "content": "and now?"})

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            r = await c.post("/v1/chat/completions", json={"model": "m", "messages": openai_msgs, "tools": tools})
            assert r.status_code == 200
            r = await c.post("/v1/messages", json={"model": "m", "max_tokens": 10, "system": "be brief",
                                                   "messages": anthropic_turns})
            assert r.status_code == 200

    asyncio.run(run())
    counter = proxy.signals.counter
    sent_openai = [Message.from_openai(m) for m in forwarded[0]["messages"]]
    sent_anthropic = anth.to_canonical(forwarded[1]["system"], forwarded[1]["messages"])[0]
    sent_results = [m["content"] for m in forwarded[0]["messages"] if m["role"] == "tool"]
    assert sent_results != [m["content"] for m in steps if m["role"] == "tool"]  # over B: some results were left out
    assert [e for e, _ in proxy.calibration._pairs] == [proxy.calibration.estimate_request(sent_openai, tools),
                                                        proxy.calibration.estimate_request(sent_anthropic)]
    assert proxy.calibration._pairs[0][0] > counter.count_messages(sent_openai)  # tools and priming on top
