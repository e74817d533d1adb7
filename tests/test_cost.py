"""Cost (ContextRender eq. 3, C.1/C.2), prefix-cache reuse and value recall, against hand-computed values."""

import pytest

from historygraph.eval.cache import PrefixReuse, shared_prefix_tokens
from historygraph.eval.cost import Prices, TraceCost, Usage, normalise, trace_cost
from historygraph.eval.recall import reuse_events
from historygraph.eval.replay import replay_budgets, replay_trace
from historygraph.eval.report import summarize
from historygraph.history.events import Message, ToolCall, Trace
from historygraph.policies import Signals, create
from historygraph.signals.tokens import MESSAGE_OVERHEAD, TokenCounter


def test_eq3_with_the_paper_prices():
    # (2·0.75 + 0.5·0.25)·1,000,000 + 8·100,000 + 0.13·200,000 = 1,625,000 + 800,000 + 26,000 -> 2.451 USD
    assert trace_cost(Usage(P=1_000_000, O=100_000, E=200_000), 0.25) == pytest.approx(2.451)
    assert trace_cost(Usage(P=1_000_000), 0.0) == pytest.approx(2.0)
    assert trace_cost(Usage(P=1_000_000), 1.0) == pytest.approx(0.5)
    cheap = Prices(input=1.0, cached_input=0.1, output=4.0, embedding=0.0)
    assert trace_cost(Usage(P=1_000_000, O=1_000_000, E=5), 0.5, cheap) == pytest.approx(0.55 + 4.0)
    with pytest.raises(ValueError, match="rho"):
        trace_cost(Usage(P=1), 1.5)


def test_prices_parse_names_what_is_wrong():
    assert Prices.parse(["input=3", "cached-input=0.3"]) == Prices(input=3.0, cached_input=0.3)
    with pytest.raises(ValueError, match="KEY one of"):
        Prices.parse(["inputs=3"])
    with pytest.raises(ValueError, match=">= 0"):
        Prices.parse(["output=-1"])


def test_normalisation_is_a_ratio_of_means_over_the_compared_traces():
    full_a = Usage(P=1_000_000, cached=900_000)
    full_b = Usage(P=3_000_000, cached=2_700_000)
    items = [
        TraceCost(Usage(P=500_000), full_a, rho=0.5, compared=True),
        TraceCost(Usage(P=1_000_000, O=100_000, cached=500_000), full_b, rho=0.5, compared=True),
        TraceCost(Usage(P=9_000_000), Usage(P=1), rho=0.5, compared=False),          # history never exceeds B
        TraceCost(Usage(P=1), full_b, rho=0.5, compared=True, failed=True),          # budget errors: left out
    ]
    n = normalise(items)
    # ρ = 0.5: an input token costs 1.25 per million. Full: 1.25 and 3.75 (mean 2.5);
    # policy: 0.625 and 1.25 + 0.8 (mean 1.3375); 1.3375 / 2.5 = 0.535 (the mean of ratios would be 0.5233)
    assert n.traces == 2
    assert n.mean_cost == pytest.approx(1.3375) and n.normalised == pytest.approx(0.535)
    # own ρ: policy 0 and 0.5 -> 1.0 and 2.05 (mean 1.525); Full 0.9 -> 0.65 and 1.95 (mean 1.3)
    assert n.mean_cost_own == pytest.approx(1.525) and n.normalised_own == pytest.approx(1.525 / 1.3)
    assert normalise(items[2:3]).normalised is None


C = TokenCounter()
SYS, TASK = Message("system", "You are an agent."), Message("user", "Fix the bug in parser.py")
A1 = Message("assistant", "", (ToolCall("c1", "bash", '{"cmd": "cat parser.py"}'),))
R1 = Message("tool", "alpha beta gamma", tool_call_id="c1")


def test_shared_prefix_counts_equal_leading_messages_then_leading_tokens():
    prev = [SYS, TASK, A1, R1]
    assert shared_prefix_tokens([], prev, C) == 0
    whole = C.count_messages([SYS, TASK, A1])
    # appending (Full history): every earlier message is a prefix
    assert shared_prefix_tokens(prev, prev + [Message("assistant", "done")], C) == whole + C.count_message(R1)
    # the result shown differently: its overhead and the common leading tokens "alpha beta" count, nothing after
    changed = [SYS, TASK, A1, R1.with_content("alpha beta [cut]", "excerpt"), Message("assistant", "x")]
    assert shared_prefix_tokens(prev, changed, C) == whole + MESSAGE_OVERHEAD + C.count("alpha beta")
    # a placeholder replacing an early message: only what precedes it is shared
    assert shared_prefix_tokens(prev, [SYS, Message("user", "other"), A1, R1], C) == C.count_message(SYS) + MESSAGE_OVERHEAD
    assert shared_prefix_tokens(prev, [Message("user", "x")] + prev, C) == 0  # another role first


def test_prefix_reuse_fraction_is_token_weighted():
    p = PrefixReuse(C, fixed_prefix=10)
    s1, s2 = [SYS, TASK], [SYS, TASK, A1, R1]
    n1, n2 = C.count_messages(s1), C.count_messages(s2)
    assert p.observe(s1, n1) == 0                       # first call: nothing cached, not even the schemas
    assert p.observe(s2, n2) == 10 + n1
    assert p.fraction == pytest.approx((10 + n1) / (n1 + 10 + n2 + 10))


def _trace():
    big = " ".join(f"word{i}" for i in range(3000))  # far over B = 1000: shown as an excerpt
    msgs = [
        Message("user", "task"),
        Message("assistant", "", (ToolCall("c1", "t"),)),
        Message("tool", f"KEY_HEAD {big} KEY_MIDDLE {big} KEY_TAIL", tool_call_id="c1"),
        Message("assistant", "I saw KEY_HEAD"),                # event 1: its value is in the excerpt's head
        Message("user", "and the middle one?"),
        Message("assistant", "KEY_MIDDLE"),                    # event 2: cut from the excerpt
    ]
    return Trace("test", "t1", "mem", msgs)


def test_value_recall_counts_values_kept_by_a_stand_in():
    """Hand-labelled: two B.4 events on result 2; prune at B = 1000 shows an excerpt of the
    oversized result (head and tail): B.4 sees no hit, value recall sees the head value only."""
    tr = _trace()
    ev = reuse_events(tr.messages)
    assert [(e.turn, e.result, set(e.tokens)) for e in ev] == [(3, 2, {"KEY_HEAD"}), (5, 2, {"KEY_MIDDLE"})]
    res = replay_trace(tr, {"prune": create("prune"), "full": create("full")}, 1000, Signals())
    prune, full = res.stats["prune"], res.stats["full"]
    assert (prune.events, prune.hits, prune.value_hits) == (2, 0, 1)
    assert (full.events, full.hits, full.value_hits) == (2, 2, 2)
    assert res.timeline.forms["prune"] == ["", "E", "E"] and res.timeline.forms["full"] == ["", "F", "F"]
    assert res.timeline.events == [(1, 0), (2, 0)]


def test_replay_prices_prompts_outputs_and_full_history_as_reference():
    tr = _trace()
    sig = Signals()
    res = replay_trace(tr, {"prune": create("prune"), "full": create("full")}, 1000, sig)
    full = res.stats["full"]
    # Full history appends: each prompt but the first is the previous prompt plus what came after it
    prompts = [C.count_messages(tr.messages[:j]) for j in (1, 3, 5)]
    assert full.prompt_tokens == sum(prompts) and full.cached_tokens == prompts[0] + prompts[1]
    assert full.output_tokens == sum(C.count_message(tr.messages[j]) for j in (1, 3, 5))
    assert res.reference.usage == full.usage and res.reference.max_history_tokens == max(full.history_tokens)
    assert res.compared  # Full history exceeds B = 1000
    per_trace, per_source = summarize([res])
    rows = {r["policy"]: r for r in per_source if r["source"] == "ALL"}
    assert rows["full"]["norm_cost"] == 1.0 and rows["full"]["norm_cost_own"] == 1.0
    assert rows["prune"]["norm_cost"] < 1.0 and rows["prune"]["value_recall"] == 50.0
    rho = full.cached_tokens / full.prompt_tokens
    assert rows["prune"]["cost_usd"] == pytest.approx(trace_cost(res.stats["prune"].usage, rho), abs=1e-6)


def test_a_budget_sweep_replays_every_budget_with_one_reference():
    tr = _trace()
    out = replay_budgets(tr, ["prune", "full"], [1000, 100_000], Signals())
    assert [r.budget for r in out] == [1000, 100_000]
    assert out[0].reference is out[1].reference
    assert [r.compared for r in out] == [True, False]
    assert out[1].stats["prune"].hits == 2  # everything fits at the large budget
