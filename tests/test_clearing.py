"""The tool-result clearing rules (policies/baselines/clearing.py): Anthropic's clear_tool_uses,
Claude Code's microcompact and low-watermark clearing, on small histories whose cleared results are
known by hand, and on real traces against the invariants."""

import pytest

from historygraph.eval.replay import replay_trace
from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import PolicyError, Signals, create
from historygraph.render import Layout, check_invariants
from historygraph.traces import read_traces

BODY = "word " * 1000  # about 1,000 tokens: clearing one frees about 970, far more than a step's other tokens


@pytest.fixture(scope="module")
def signals():
    return Signals()


def step(i, tool="bash"):
    return [Message("assistant", f"step {i}", (ToolCall(f"c{i}", tool, "{}"),)), Message("tool", BODY, tool_call_id=f"c{i}")]


def graph_of(n, tools=lambda i: "bash"):
    msgs = [Message("system", "s"), Message("user", "task")]
    for i in range(n):
        msgs += step(i, tools(i))
    return ContextGraph("g", msgs)


def at(i):
    """The position of result i (system 0, user 1, step i's call at 2 + 2i)."""
    return 3 + 2 * i


def history_of(n, signals):
    """History tokens (B's scope) of the complete history of n steps: a budget the rule must act on
    once an (n + 1)-th step arrives."""
    return Layout(graph_of(n), signals.counter, None).full_history_tokens


def cleared(r):
    return sorted(p for p, m in zip(r.positions, r.messages) if m.rendered_as == "placeholder")


def grow(policy, n_from, n_to, budget, signals, tools=lambda i: "bash"):
    """Render at every call from n_from to n_to steps on one growing graph (the replay's order):
    the renderings, each checked against the invariants."""
    g = graph_of(n_from, tools)
    out = []
    for n in range(n_from, n_to + 1):
        if n > n_from:
            for m in step(n - 1, tools(n - 1)):
                g.append(m)
        r = policy.render(g, budget, signals)
        check_invariants(r, g, signals.counter)
        out.append(r)
    return out


def test_microcompact_fires_over_b_keeps_the_five_newest_and_results_stay_cleared(signals):
    # B = 7 steps: at 8 steps the history passes B, results 0-2 are cleared (5 newest kept). At 9 steps
    # 6 full results + 3 placeholders are under 7 full results: nothing new. At 10 steps 7 full + 3
    # placeholders pass B: results 3 and 4 join.
    B = history_of(7, signals)
    r7, r8, r9, r10 = grow(create("microcompact"), 7, 10, B, signals)
    assert cleared(r7) == []
    assert cleared(r8) == [at(0), at(1), at(2)]
    assert cleared(r9) == [at(0), at(1), at(2)] and r9.full == [at(i) for i in range(3, 9)]
    assert cleared(r10) == [at(i) for i in range(5)]
    # between firings the prompt only grows: the call at 9 steps starts with the call at 8 steps
    assert r9.messages[:len(r8.messages)] == r8.messages


def test_microcompact_clears_only_the_compactable_tools(signals):
    tools = lambda i: "Read" if i % 2 else "TodoWrite"  # noqa: E731
    g = graph_of(14, tools)
    r = create("microcompact", compactable=("Read",)).render(g, history_of(13, signals), signals)
    check_invariants(r, g, signals.counter)
    # Read results are 1, 3, ..., 13; the 5 newest (5, 7, 9, 11, 13) are kept, 1 and 3 cleared (which
    # brings 14 steps under B = 13 steps); no TodoWrite result is cleared
    assert cleared(r) == [at(1), at(3)]
    assert not any(r.reasons[at(i)].startswith("cleared") for i in range(0, 14, 2))


def test_clear_tool_uses_keeps_the_three_newest_and_the_excluded_tools(signals):
    tools = lambda i: "read" if i % 2 else "bash"  # noqa: E731
    g = graph_of(8, tools)
    B = history_of(6, signals)
    r = create("clear-tool-uses").render(g, B, signals)
    check_invariants(r, g, signals.counter)
    assert cleared(r) == [at(i) for i in range(5)] and r.full == [at(5), at(6), at(7)]
    r = create("clear-tool-uses", exclude_tools=("read",)).render(g, B, signals)
    check_invariants(r, g, signals.counter)
    assert cleared(r) == [at(0), at(2), at(4)] and r.full == [at(1), at(3), at(5), at(6), at(7)]
    r = create("clear-tool-uses", keep=1).render(g, B, signals)
    assert cleared(r) == [at(i) for i in range(7)] and r.full == [at(7)]


def test_clear_tool_uses_applies_to_each_request_and_only_the_tail_changes(signals):
    # the server sees the full history at every request: over the trigger, each new step pushes one
    # more result out of the 3 kept, and everything before it is as in the previous request
    B = history_of(6, signals)
    r8, r9 = grow(create("clear-tool-uses"), 8, 9, B, signals)
    assert cleared(r8) == [at(i) for i in range(5)] and cleared(r9) == [at(i) for i in range(6)]
    cut = r8.positions.index(at(5))
    assert r9.messages[:cut] == r8.messages[:cut]


def test_clear_tool_uses_clear_at_least_gates_the_clearing(signals):
    # clearing results 0-4 frees about 5 × 970 tokens: a minimum above it clears nothing, and the
    # history (8 steps, B = 6) is then held to B by leaving out the oldest steps down to B/2 (3
    # steps kept: 5 × 1,012 tokens left out); a minimum below it clears them
    g = graph_of(8)
    B = history_of(6, signals)
    r = create("clear-tool-uses", clear_at_least=6000).render(g, B, signals)
    check_invariants(r, g, signals.counter)
    assert r.stats["cleared"] == 0 and not any(v.startswith("cleared") for v in r.reasons.values())
    assert r.full == [at(5), at(6), at(7)] and cleared(r) == [] and r.dropped == list(range(2, 12))
    r = create("clear-tool-uses", clear_at_least=4000).render(g, B, signals)
    assert cleared(r) == [at(i) for i in range(5)]


def test_low_watermark_clears_the_oldest_down_to_half_and_holds_until_b(signals):
    # B = 7 steps (about 7,100 tokens), low mark 3,550. At 8 steps (about 8,100) it fires and clears
    # the oldest until under the mark: 4 cleared leave about 4,200, 5 leave about 3,250: results 0-4.
    # Then 9, 10 and 11 steps stay under B (3,250 + 1,012 a step), nothing new is cleared and each
    # call extends the previous one; at 12 steps (about 7,300) it fires again.
    B = history_of(7, signals)
    rs = grow(create("low-watermark"), 8, 12, B, signals)
    assert cleared(rs[0]) == [at(i) for i in range(5)] and rs[0].full == [at(5), at(6), at(7)]
    for prev, cur in zip(rs[:3], rs[1:4]):
        assert cleared(cur) == cleared(rs[0]) and cur.messages[:len(prev.messages)] == prev.messages
    assert cleared(rs[4]) == [at(i) for i in range(9)] and rs[4].full == [at(9), at(10), at(11)]


def test_steps_left_out_to_hold_b_stay_left_out_until_b_is_passed_again(signals):
    # steps of 10 one-token results and a 300-token assistant text: clearing frees nothing, so at
    # 8 steps over B = 7 steps the oldest steps are left out down to B/2; later calls only append
    # until the history passes B again
    msgs = [Message("system", "s"), Message("user", "task")]
    def big(i):
        return [Message("assistant", f"step {i} " + "think " * 300, (ToolCall(f"c{i}", "bash", "{}"),)),
                Message("tool", f"ok {i}", tool_call_id=f"c{i}")]
    for i in range(8):
        msgs += big(i)
    g = ContextGraph("g", msgs)
    B = Layout(ContextGraph("h", msgs[:-2]), signals.counter, None).full_history_tokens
    policy = create("low-watermark")
    first = policy.render(g, B, signals)
    check_invariants(first, g, signals.counter)
    assert first.dropped and cleared(first) == []
    prev = first
    for i in range(8, 11):
        for m in big(i):
            g.append(m)
        r = policy.render(g, B, signals)
        check_invariants(r, g, signals.counter)
        assert r.messages[:len(prev.messages)] == prev.messages and r.dropped == first.dropped
        prev = r


def test_low_watermark_never_clears_the_newest_result(signals):
    g = graph_of(8)
    r = create("low-watermark", low_mark=0.01).render(g, history_of(7, signals), signals)
    check_invariants(r, g, signals.counter)
    assert cleared(r) == [at(i) for i in range(7)] and r.full == [at(7)]


def test_a_history_under_b_comes_back_unchanged(signals):
    g = graph_of(3)
    for name in ("clear-tool-uses", "microcompact", "low-watermark"):
        r = create(name).render(g, history_of(3, signals), signals)
        assert r.messages == g.messages and cleared(r) == []


@pytest.mark.parametrize("name,params,field", [("low-watermark", {"low_mark": 0.0}, "low_mark"),
                                               ("microcompact", {"keep": -1}, "keep"),
                                               ("clear-tool-uses", {"clear_at_least": -5}, "clear_at_least"),
                                               ("clear-tool-uses", {"clear_tool_inputs": True}, "clear_tool_inputs")])
def test_bad_parameters_are_refused_by_name(name, params, field):
    with pytest.raises(PolicyError, match=field):
        create(name, **params)


@pytest.mark.parametrize("rel", ["mini-swe-agent-deepseek/sqlfluff__sqlfluff-2419.traj.json",
                                 "openhands/multi_swe_bench_examples/output.jsonl"])
def test_every_rendering_of_a_real_trace_holds_the_invariants(traces_dir, signals, rel):
    trace = next(iter(read_traces(traces_dir / rel)))
    for budget in (6000, 3000):
        policies = {n: create(n) for n in ("clear-tool-uses", "microcompact", "low-watermark")}
        res = replay_trace(trace, policies, budget, signals)
        for name in policies:
            st = res.stats[name]
            assert st.violations == [], (rel, name, budget, st.violations[:2])
            assert max(st.history_tokens) <= budget


def test_every_rendering_of_a_claude_code_session_holds_the_invariants(sessions_dir, signals):
    path = sorted((sessions_dir / "claude-code").glob("*.jsonl.gz"))[0]
    trace = next(iter(read_traces(path)))
    policies = {n: create(n) for n in ("clear-tool-uses", "microcompact", "low-watermark")}
    res = replay_trace(trace, policies, 16000, signals)
    for name in policies:
        assert res.stats[name].violations == [], (name, res.stats[name].violations[:2])
        assert max(res.stats[name].history_tokens) <= 16000
