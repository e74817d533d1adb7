"""Provider prompt caches through the proxy (issue 37 item 3, issue 38 class 10): where the proxy
puts Anthropic ``cache_control`` breakpoints beside the client's own (never more than 4), the
client's breakpoint kept on a placeholder, the fake provider's cache simulation, cache usage read
back into ``/metrics`` for every API, streamed and not, and the 25-call target."""

from __future__ import annotations

import re

import httpx
import pytest

from historygraph.providers.anthropic import Piece
from historygraph.providers.anthropic_cache import breakpoints, count_breakpoints, moved_breakpoints, place_breakpoints

import fake_cache
from cache_run import anthropic_run, stack
from fake_upstream import anthropic_violation, sign

CC = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
THINK = {"type": "thinking", "thinking": "t", "signature": sign("t")}


def request(system_marks=(False, False), message_marks=()) -> dict:
    """Two tools, two system blocks, then: a user task, an assistant turn (thinking, text,
    tool_use), a user turn (tool_result, an empty text). ``system_marks``: client breakpoints on
    the system blocks; ``message_marks``: (message, block) pairs the client marked."""
    system = [{"type": "text", "text": f"system {j}", **({"cache_control": CC} if m else {})} for j, m in enumerate(system_marks)]
    messages = [{"role": "user", "content": [{"type": "text", "text": "task"}]},
                {"role": "assistant", "content": [THINK, {"type": "text", "text": "ok"}, {"type": "tool_use", "id": "u1", "name": "bash", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1", "content": "out"}, {"type": "text", "text": ""}]}]
    for k, j in message_marks:
        messages[k]["content"][j] = {**messages[k]["content"][j], "cache_control": CC}
    return {"model": "m", "max_tokens": 10, "tools": [{"name": "bash", "input_schema": {}}, {"name": "edit", "input_schema": {}}],
            "system": system, "messages": messages}


def test_breakpoints_go_after_the_system_prompt_and_on_the_last_message_beside_the_clients_own():
    body = request(system_marks=(True, False), message_marks=[(1, 1)])
    out = place_breakpoints(body)
    # the client's: system block 0, the assistant's text; ours: the last system block, and the last
    # block of the last message that may carry one (the tool_result: an empty text may not)
    assert breakpoints(out) == [(1, 0, 0), (1, 1, 0), (2, 1, 1), (2, 2, 0)]
    assert out["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "u1", "content": "out", "cache_control": CC},
                                             {"type": "text", "text": ""}]
    assert breakpoints(body) == [(1, 0, 0), (2, 1, 1)]  # the client's request is not changed in place
    assert anthropic_violation(out) is None


def test_ours_also_mark_the_opening_so_a_re_selection_reads_the_task_from_the_cache():
    out = place_breakpoints(request())
    # the last system block, the task (the first message: its only block), the tool_result
    assert breakpoints(out) == [(1, 1, 0), (2, 0, 0), (2, 2, 0)]
    assert anthropic_violation(out) is None
    one = place_breakpoints({"system": "s", "messages": [{"role": "user", "content": "task"}]})
    assert breakpoints(one) == [(1, 0, 0), (2, 0, 0)]  # the opening is the last message: one breakpoint there


def test_ours_are_dropped_first_then_the_clients_earliest_never_more_than_four():
    three = place_breakpoints(request(system_marks=(True, False), message_marks=[(0, 0), (1, 1)]))
    assert breakpoints(three) == [(1, 0, 0), (2, 0, 0), (2, 1, 1), (2, 2, 0)]  # only ours on the last message
    four = request(system_marks=(True, True), message_marks=[(0, 0), (1, 1)])
    assert place_breakpoints(four) is four  # nothing to add
    five = request(system_marks=(True, True), message_marks=[(0, 0), (1, 1), (2, 0)])
    assert anthropic_violation(five) == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    trimmed = place_breakpoints(five)
    assert breakpoints(trimmed) == [(1, 1, 0), (2, 0, 0), (2, 1, 1), (2, 2, 0)]
    assert "cache_control" not in trimmed["system"][0] and anthropic_violation(trimmed) is None


def test_a_top_level_cache_control_stands_for_ours_on_the_last_message():
    out = place_breakpoints({**request(), "cache_control": CC})
    assert breakpoints(out) == [(1, 1, 0), (2, 0, 0)] and count_breakpoints(out) == 3


def test_ours_take_the_ttl_of_a_later_client_breakpoint_so_ttls_never_increase():
    body = request(message_marks=[(0, 0)])
    body["messages"][0]["content"][0]["cache_control"] = HOUR
    out = place_breakpoints(body)
    assert out["system"][1]["cache_control"] == HOUR  # before the client's 1-hour breakpoint
    assert out["messages"][2]["content"][0]["cache_control"] == CC  # after it: 5 minutes


def test_rule_5_the_young_generation_is_written_with_the_5_minute_ttl_the_old_generations_end_keeps_the_hour():
    """Claude Code-like: the hour on the system prompt and on the messages it marks. With
    ``young_short`` every breakpoint after the old generation's end (the assistant turn here) is
    5-minute, the client's own on the last message included; the end itself and what precedes it
    keep the hour; the request is one Anthropic accepts (no hour after 5 minutes)."""
    body = request(system_marks=(False, True), message_marks=[(2, 0)])
    body["system"][1]["cache_control"] = HOUR
    body["messages"][2]["content"][0]["cache_control"] = HOUR
    before = place_breakpoints(body, [(1, 2)])
    assert before["messages"][1]["content"][2]["cache_control"] == HOUR  # the end of the old generation
    assert before["messages"][2]["content"][0]["cache_control"] == HOUR  # without rule 5: the client's hour
    out = place_breakpoints(body, [(1, 2)], young_short=True)
    assert out["system"][1]["cache_control"] == HOUR
    assert out["messages"][0]["content"][0]["cache_control"] == HOUR  # the opening, before the end
    assert out["messages"][1]["content"][2]["cache_control"] == HOUR
    assert out["messages"][2]["content"][0]["cache_control"] == CC  # the client's, after the end: 5 minutes
    assert anthropic_violation(out) is None and anthropic_violation(before) is None
    assert body["messages"][2]["content"][0]["cache_control"] == HOUR  # the request itself is not changed
    # without a boundary there is no young generation to shorten
    assert place_breakpoints(body, [], young_short=True) == place_breakpoints(body, [])
    # the fake rejects what Anthropic would: an hour after 5 minutes
    wrong = {**before, "system": [before["system"][0], {**before["system"][1], "cache_control": CC}]}
    assert "must not come after" in (anthropic_violation(wrong) or "")


def test_rule_6_under_a_5_minute_client_the_old_generation_and_what_precedes_it_go_on_the_hour():
    """Claude Code on the 5-minute cache marks its system prompt and last message without a TTL.
    With ``old_long`` every breakpoint up to the old generation's end (the assistant turn here),
    the client's on the system prompt included, carries the hour; the young generation's, the
    client's on the last message, stays at 5 minutes; Anthropic accepts the order (the hour
    first). Without a boundary nothing is lengthened."""
    body = request(system_marks=(False, True), message_marks=[(2, 0)])
    out = place_breakpoints(body, [(1, 2)], young_short=True, old_long=True)
    assert out["system"][1]["cache_control"] == HOUR
    assert out["messages"][0]["content"][0]["cache_control"] == HOUR  # the opening, before the end
    assert out["messages"][1]["content"][2]["cache_control"] == HOUR  # the old generation's end
    assert out["messages"][2]["content"][0]["cache_control"] == CC  # the client's, in the young generation
    assert anthropic_violation(out) is None
    assert body["system"][1]["cache_control"] == CC  # the request itself is not changed
    assert place_breakpoints(body, [], old_long=True) == place_breakpoints(body, [])
    plain = place_breakpoints(body, [(1, 2)], young_short=True)
    assert plain["system"][1]["cache_control"] == CC and plain["messages"][1]["content"][2]["cache_control"] == CC


def test_a_request_with_an_hour_breakpoint_is_sent_with_the_extended_ttl_beta():
    """The 1-hour TTL needs ``anthropic-beta: extended-cache-ttl-2025-04-11`` (rule 6 adds hours a
    5-minute client never asked for): the upstream headers get it, joined to the client's betas and
    never twice; a request without an hour, or an OpenAI one, is forwarded as it came."""
    from fake_upstream import beta_violation
    from historygraph.server.upstream import forward_headers

    body = request(system_marks=(False, True))
    hour = {**body, "system": [body["system"][0], {**body["system"][1], "cache_control": HOUR}]}
    client = {"x-api-key": "k", "anthropic-beta": "interleaved-thinking-2025-05-14"}
    assert beta_violation(hour, client) is not None and beta_violation(body, client) is None
    sent = forward_headers(client, hour)
    assert sent["anthropic-beta"] == "interleaved-thinking-2025-05-14,extended-cache-ttl-2025-04-11"
    assert beta_violation(hour, sent) is None
    assert forward_headers(sent, hour)["anthropic-beta"] == sent["anthropic-beta"]
    assert "anthropic-beta" not in forward_headers({"x-api-key": "k"}, body)
    assert forward_headers({"x-api-key": "k"}, {"cache_control": HOUR, "messages": []})["anthropic-beta"] \
        == "extended-cache-ttl-2025-04-11"
    assert "anthropic-beta" not in forward_headers({"authorization": "b"}, {"model": "m", "input": "hi"})


def test_a_string_system_prompt_and_string_last_message_become_one_marked_text_block():
    out = place_breakpoints({"system": "be brief", "messages": [{"role": "user", "content": "hi"}]})
    assert out["system"] == [{"type": "text", "text": "be brief", "cache_control": CC}]
    assert out["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": CC}]}]


def test_a_placeholder_keeps_the_breakpoint_the_client_put_on_the_result_it_replaces():
    from historygraph import render_anthropic_messages

    msgs: list[dict] = [{"role": "user", "content": "task"}]
    for i in range(3):
        msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"c{i}", "name": "bash", "input": {"i": i}}]})
        result = {"type": "tool_result", "tool_use_id": f"c{i}", "content": f"result{i} " * 200}
        msgs.append({"role": "user", "content": [{**result, "cache_control": CC} if i == 0 else result]})
    msgs.append({"role": "user", "content": "and now?"})
    out = render_anthropic_messages(msgs, budget=800, policy="prune")
    first = out[2]["content"][0]
    assert first["content"].startswith("[tool result c0 omitted") and first["cache_control"] == CC
    assert sum("cache_control" in b for m in out if isinstance(m["content"], list) for b in m["content"]) == 1


def test_a_breakpoint_on_a_message_left_out_moves_to_the_next_message_shown():
    pieces = [Piece({"role": "user", "content": "task"}, 0), Piece({"role": "assistant", "content": "a"}, 1),
              Piece([{"type": "text", "text": "old", "cache_control": CC}], 2),
              Piece({"role": "assistant", "content": [{"type": "text", "text": "b", "cache_control": HOUR}]}, 3),
              Piece("new", 4)]
    # positions 2 and 3 dropped; the marker (None) stands for them at rendered index 2
    assert moved_breakpoints([0, 1, None, 4], pieces) == {2: CC}
    assert moved_breakpoints([0, 1, 2, 3, 4], pieces) == {}
    assert moved_breakpoints([0, 1], pieces) == {1: CC}  # none shown after them: the last message


def test_the_fake_rejects_a_breakpoint_on_a_thinking_block():
    body = request()
    body["messages"][1]["content"][0] = {**THINK, "cache_control": CC}
    assert anthropic_violation(body) == "messages: cache_control cannot be set on thinking blocks"


def test_openai_cache_hits_are_1024_tokens_then_whole_128_token_steps():
    # platform.openai.com/docs/guides/prompt-caching
    assert [fake_cache.rounded_hit(n) for n in (0, 1023, 1024, 1151, 1152, 5000)] == [0, 0, 1024, 1024, 1152, 4992]


def test_the_anthropic_simulation_reads_only_at_breakpoints_within_20_blocks():
    caches = fake_cache.PromptCaches()
    long = "word " * 1500  # over the 1,024-token minimum on its own

    def body(n_extra: int, mark_last: bool = True, model: str = "m") -> dict:
        blocks = [{"type": "text", "text": long}] + [{"type": "text", "text": f"extra {i}"} for i in range(n_extra)]
        if mark_last:
            blocks[-1] = {**blocks[-1], "cache_control": CC}
        return {"model": model, "messages": [{"role": "user", "content": blocks}]}

    first = caches.usage("anthropic", body(0))
    total = first["cache_creation_input_tokens"]
    assert first == {"input_tokens": 0, "cache_creation_input_tokens": total, "cache_read_input_tokens": 0, "output_tokens": 1,
                     "cache_creation": {"ephemeral_5m_input_tokens": total, "ephemeral_1h_input_tokens": 0}}
    assert total > 1024
    assert caches.usage("anthropic", body(0))["cache_read_input_tokens"] == total  # the same prefix again: read
    grown = caches.usage("anthropic", body(20))  # 20 blocks appended, marked at the end: the entry is 20 blocks back
    assert grown["cache_read_input_tokens"] == total and grown["cache_creation_input_tokens"] > 0
    far = caches.usage("anthropic", body(41))  # the newest entry (20 extra blocks) is 21 blocks back: not seen
    assert far["cache_read_input_tokens"] == 0
    unmarked = caches.usage("anthropic", body(0, mark_last=False, model="other"))
    assert unmarked["cache_read_input_tokens"] == unmarked["cache_creation_input_tokens"] == 0 and unmarked["input_tokens"] == total


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    with stack(tmp_path_factory.mktemp("cache"), "--policy", "prune", "--budget", "800") as urls:
        yield urls


def metric(proxy: str, api: str, kind: str) -> float:
    text = httpx.get(proxy + "/metrics").text
    m = re.search(rf'^historygraph_input_tokens_total{{api="{api}",kind="{kind}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def read_usage(api: str, stream: bool, r: httpx.Response) -> tuple[int, int, int]:
    """(cache read, cache write, uncached) of an answer, from its JSON or its stream's events."""
    import json

    if stream:
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        if api == "anthropic":
            u = {**events[0]["message"]["usage"], **next(e for e in events if e["type"] == "message_delta")["usage"]}
        elif api == "responses":
            u = next(e for e in events if e["type"] == "response.completed")["response"]["usage"]
        else:
            u = next(e for e in events if e.get("usage"))["usage"]
    else:
        u = r.json()["usage"]
    if api == "anthropic":
        return u["cache_read_input_tokens"], u["cache_creation_input_tokens"], u["input_tokens"]
    if api == "responses":
        return u["input_tokens_details"]["cached_tokens"], 0, u["input_tokens"] - u["input_tokens_details"]["cached_tokens"]
    return u["prompt_tokens_details"]["cached_tokens"], 0, u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("api", ["anthropic", "openai", "responses"])
@pytest.mark.parametrize("stream", [False, True])
def test_cache_usage_is_read_back_into_metrics(cached, api, stream):
    proxy, _ = cached
    text = "You are a careful agent. " * 300  # ~1,500 tokens: cacheable on both providers
    sid = f"usage-{api}-{stream}"
    headers = {"X-HistoryGraph-Session": sid, "x-api-key": "k", "anthropic-version": "2023-06-01", "Authorization": "Bearer k"}
    path, body = {"anthropic": ("/v1/messages", {"model": sid, "max_tokens": 5, "system": text, "messages": []}),
                  "openai": ("/v1/chat/completions", {"model": sid, "messages": [{"role": "system", "content": text}],
                                                      **({"stream_options": {"include_usage": True}} if stream else {})}),
                  "responses": ("/v1/responses", {"model": sid, "instructions": text, "input": []})}[api]
    kinds = ("cache_read", "cache_write", "uncached")
    before = [metric(proxy, api, k) for k in kinds]
    got = []
    for n in range(2):
        turn = {"role": "user", "content": f"question {n}"}
        items = {"anthropic": "messages", "openai": "messages", "responses": "input"}[api]
        payload = {**body, "stream": stream, items: [*body[items], turn]}
        r = httpx.post(proxy + path, json=payload, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        got.append(read_usage(api, stream, r))
    after = [metric(proxy, api, k) for k in kinds]
    assert [a - b for a, b in zip(after, before)] == [sum(g[i] for g in got) for i in range(3)]
    assert got[0][0] == 0 and got[1][0] > 1000  # the second call read the system prompt from the cache
    if api == "anthropic":
        assert got[0][1] > 1000  # written at the proxy's breakpoints (the client set none)


def test_a_client_with_five_breakpoints_is_forwarded_with_four(cached):
    proxy, fake = cached
    body = request(system_marks=(True, True), message_marks=[(0, 0), (1, 1), (2, 0)])
    r = httpx.post(proxy + "/v1/messages", json=body, headers={"X-HistoryGraph-Session": "five", "x-api-key": "k",
                                                               "anthropic-version": "2023-06-01"}, timeout=60)
    assert r.status_code == 200, r.text
    sent = httpx.get(fake + "/_requests").json()[-1]["body"]
    assert count_breakpoints(sent) == 4 and "cache_control" not in sent["system"][0]


def test_a_25_call_run_through_the_proxy_sends_at_most_half_the_uncached_input(tmp_path):
    """Issue 37's target: mini-swe-agent-like client (no breakpoints of its own) on Anthropic, 25
    calls, B = 6000, the proxy's defaults (learned, cache-stable, breakpoints on) against the
    client's own requests sent to the same fake. Measured (tests/cache_run.py): 33,166 against
    212,050 uncached tokens (0.16); 86,737 (0.41) with --no-cache-stable."""
    with stack(tmp_path) as (proxy, fake):
        own = anthropic_run(fake, "own", 25, "full", 6000)
        ours = anthropic_run(proxy, "ours", 25, "learned", 6000)
    assert own.read == own.write == 0  # no breakpoint: Anthropic caches nothing
    assert ours.uncached <= 0.5 * own.uncached, (ours, own)
