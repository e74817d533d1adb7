"""The bill bound (historygraph.eval.bill_bound): hand-computed on a four-call trace, and on real
traces no policy (not even the exact recall bound) costs less than the bound at its own recall."""

import math

import pytest

from historygraph.eval.bill_bound import bill_bound, bound_inputs
from historygraph.eval.prices import PriceModel, default_price_models
from historygraph.eval.recall import reuse_events
from historygraph.eval.replay import replay_budgets, tool_schema_tokens
from historygraph.eval.report import summarize
from historygraph.history.events import Message, ToolCall
from historygraph.policies import Signals
from historygraph.signals.tokens import TokenCounter

C = TokenCounter()


def _call(i: int, args: str) -> Message:
    return Message(role="assistant", content="", tool_calls=(ToolCall(id=f"c{i}", name="sh", arguments=args),))


def _messages() -> list[Message]:
    # r1 (position 2) holds DB_PORT_4411, first seen there; the call at 3 names it (r1 is its newest
    # result: free) and so does the answer at 5 (r1 is two calls old: a resend). r2 holds nothing reused.
    return [Message(role="user", content="find the port"),
            _call(1, '{"cmd": "cat env"}'),
            Message(role="tool", tool_call_id="c1", content="DB_PORT_4411 = 5432\n" + "filler words here\n" * 40),
            _call(2, '{"cmd": "grep DB_PORT_4411 src"}'),
            Message(role="tool", tool_call_id="c2", content="nothing\n" * 30),
            Message(role="assistant", content="The port is set by DB_PORT_4411.")]


def test_the_floor_and_the_resend_by_hand():
    msgs = _messages()
    events = reuse_events(msgs)
    assert sorted((e.turn, e.result) for e in events) == [(3, 2), (5, 2)]
    size = [C.count_message(m) for m in msgs]
    b = bound_inputs(msgs, events, C, fixed=7, budget=None)
    # every message before the last call once, the schemas once; the schemas read again at calls 2 and 3
    assert b.once == 7 + sum(size[:5]) and b.schema_reads == 7 * 2
    assert (b.events, b.free, b.resends) == (2, 1, [size[2]])
    m = PriceModel(name="t", caching="automatic", input=1.0, cached_input=0.1, output=2.0, ttl_calls=10, cache_write=1.25)
    out = size[1] + size[3] + size[5]
    floor = (b.once * 1.0 + 14 * 0.1 + out * 2.0) / 1e6  # input is cheaper than a write: the first sending uncached
    assert bill_bound(m, b, out, 0.0) == pytest.approx(floor)
    assert bill_bound(m, b, out, 50.0) == pytest.approx(floor)  # one event of two: the free one
    assert bill_bound(m, b, out, 100.0) == pytest.approx(floor + size[2] * 0.1 / 1e6)


def test_a_newest_result_that_cannot_be_shown_whole_counts_nothing():
    msgs = _messages()
    size = [C.count_message(m) for m in msgs]
    # B holds the first user message and call 1 but not r1 beside them: r1 may be an excerpt of any size
    budget = size[0] + size[1] + size[2] - 1
    assert budget >= size[0] + size[3] + size[4]  # r2 still fits beside its call
    b = bound_inputs(msgs, reuse_events(msgs), C, fixed=0, budget=budget)
    assert b.once == sum(size[:5]) - size[2]


def test_no_policy_costs_less_than_the_bound_at_its_recall_on_real_traces(traces_dir):
    from historygraph.traces import read_traces

    traces = [t for t in read_traces(traces_dir / "mini-swe-agent-deepseek") if len(t.messages) > 40][:2]
    assert traces, "no mini-swe-agent trace with more than 40 messages"
    results = []
    for t in traces:
        results += replay_budgets(t, ["learned-stable", "prune", "full", "oracle"], [3000, 6000], Signals())
        assert tool_schema_tokens(t, C) >= 0
    per_trace, per_source = summarize(results)
    checked = 0
    for r in per_trace + per_source:
        for name in default_price_models():
            cost, least = r.get(f"cost_cache_usd_{name}"), r.get(f"bound_cache_usd_{name}")
            if cost is None or least is None:
                continue
            assert least <= cost + 1e-9, (r["policy"], r.get("session"), r["budget"], name, least, cost)
            assert least > 0 and math.isfinite(least)
            checked += 1
    assert checked >= 2 * 2 * 4 * len(default_price_models())
