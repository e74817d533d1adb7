"""docs/architecture.md §5 over every registered policy, on synthetic edge cases and on real traces."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from historygraph.history.events import Message, ToolCall
from historygraph.eval.replay import full_reference, replay_trace
from historygraph.traces import read_traces
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, config_fields, create, names
from historygraph.render import BudgetTooSmallError, InvariantError, Rendering, check_invariants, render_order
from historygraph.render._facts import stored_facts
from historygraph.signals.tokens import TokenCounter

from doubles import ScriptedModel, TableScorer

POLICIES = names()


@pytest.fixture(scope="module")
def signals():
    # summarising policies (ContextWeaver) get a deterministic test-double model: the invariants
    # concern the rendering, not the summary text, and the local model would take minutes here
    return Signals(model_factory=ScriptedModel, scorer_factory=TableScorer)


def call(cid):
    return ToolCall(cid, "bash", '{"command": "cat f"}')


def test_checker_catches_an_orphaned_result(signals):
    g = ContextGraph("g", [Message("user", "u"), Message("assistant", "", (call("c1"),)),
                           Message("tool", "out", tool_call_id="c1"), Message("assistant", "done")])
    broken = Rendering("x", 100, [g.messages[0], g.messages[2], g.messages[3]], [0, 2, 3], [2], [], [1], 0, 0)
    broken.history_tokens = sum(signals.counter.count_message(m) for m in broken.messages[1:])
    with pytest.raises(InvariantError, match="pairing"):
        check_invariants(broken, g, signals.counter)


@pytest.mark.parametrize("name", POLICIES)
def test_parallel_calls_stay_atomic_and_budget_holds(name, signals):
    msgs = [Message("system", "s"), Message("user", "task")]
    msgs.append(Message("assistant", "seven at once", tuple(call(f"p{i}") for i in range(7))))
    msgs += [Message("tool", f"result {i} " + "data " * 300, tool_call_id=f"p{i}") for i in range(7)]
    msgs.append(Message("assistant", "", (call("last"),)))  # in flight: no result yet
    g = ContextGraph("g", msgs)
    r = create(name).render(g, 1200, signals)
    check_invariants(r, g, signals.counter)
    assert r.messages[-1] == msgs[-1]


@pytest.mark.parametrize("name", POLICIES)
def test_under_budget_history_comes_back_unchanged(name, signals):
    msgs = [Message("system", "s"), Message("user", "u"), Message("assistant", "", (call("c1"),)),
            Message("tool", "ok", tool_call_id="c1")]
    g = ContextGraph("g", msgs)
    assert create(name).render(g, 6000, signals).messages == msgs


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.lm) if n in ("recap", "recap-line", "recap-paragraph") else n
                                  for n in POLICIES if n != "full"])  # those three run the SmolLM2 proxy attention
def test_budget_below_protected_history_raises_with_shortfall(name, signals):
    msgs = [Message("user", "first task " * 200), Message("assistant", "", (call("c1"),)),
            Message("tool", "x", tool_call_id="c1"), Message("user", "now this")]
    g = ContextGraph("g", msgs)
    with pytest.raises(BudgetTooSmallError) as info:
        create(name).render(g, 50, signals)
    assert info.value.shortfall == info.value.required - 50 > 0


def test_unanswered_call_gets_a_synthetic_error_result(signals):
    msgs = [Message("user", "u"), Message("assistant", "", (call("c1"),)), Message("user", "next")]
    g = ContextGraph("g", msgs)
    r = create("prune").render(g, 6000, signals)
    check_invariants(r, g, signals.counter)
    assert r.messages[2].role == "tool" and "c1" in r.messages[2].content


def airline_session() -> list[Message]:
    """A τ²-bench-style airline session of 27 calls: 13 look-ups of one JSON record each, then 14
    calls of six flight searches that all find nothing (84 results ``[]``, a token or two each)."""
    import json

    msgs = [Message("system", "You are an airline customer service agent. Follow the airline policy."),
            Message("user", "Hi! I need to move my trip from New York to Seattle to a later date. My user id is mia_li_3668.")]
    look_ups = [("get_user_details", {"user_id": "mia_li_3668"}), ("get_reservation_details", {"reservation_id": "NO6JO3"}),
                ("get_reservation_details", {"reservation_id": "AIXC49"})]
    for i in range(13):
        name, args = look_ups[i % 3]
        record = {"reservation_id": "NO6JO3", "origin": "JFK", "destination": "SEA", "cabin": "economy",
                  "flights": [{"flight_number": f"HAT{100 + i}", "date": "2024-05-15", "price": 120 + i}],
                  "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}], "payment_history": []}
        msgs += [Message("assistant", f"Let me look that up ({i}).", (ToolCall(f"call_{i}", name, json.dumps(args)),)),
                 Message("tool", json.dumps(record), tool_call_id=f"call_{i}")]
    for i in range(14):
        calls = tuple(ToolCall(f"search_{i}_{d}", "search_direct_flight",
                               json.dumps({"origin": "JFK", "destination": "SEA", "date": f"2024-05-{16 + d:02d}"})) for d in range(6))
        msgs.append(Message("assistant", "", calls))
        msgs += [Message("tool", "[]", tool_call_id=c.id) for c in calls]
    return msgs


def _uses_attention_model(name):
    cfg = config_fields(name)  # ReCAP's proxy attention runs the local SmolLM2 model
    return cfg.get("attention") == "proxy" and cfg.get("use_graph", True)


@pytest.mark.parametrize("name", [n for n in POLICIES if not _uses_attention_model(n)])
def test_a_larger_budget_renders_where_a_smaller_one_does(name, signals):
    """Issue 48, item 7: a placeholder (~45 tokens) costs far more than a result ``[]``, so with
    every result priced as one the history was over B = 5000 while the whole of it fits: the layout
    skipped the drop (the history fits) and then refused the newest results, raising
    BudgetTooSmallError where B = 3000 renders. A history that fits comes back unchanged (§5.5)."""
    msgs, count = airline_session(), signals.counter.count_message
    ends = [n for n in range(3, len(msgs) + 1) if msgs[n - 1].role == "tool" and (n == len(msgs) or msgs[n].role != "tool")]
    assert len(ends) == 27
    whole = {n: sum(count(m) for m in msgs[2:n]) for n in ends}  # B covers all but the system and the current user message
    assert whole[ends[-1]] <= 5000 < 2 * whole[ends[-1]] and whole[ends[-1]] > 3000  # both sides of B are reached
    policy = create(name)
    for budget in (3000, 5000, 7000):
        for n in ends[11:]:
            g = ContextGraph("airline", msgs[:n])
            r = policy.render(g, budget, signals)
            check_invariants(r, g, signals.counter)
            if whole[n] <= budget:
                assert r.messages == msgs[:n], (budget, n)


REAL_PICKS = ["mini-swe-agent-deepseek/sqlfluff__sqlfluff-2419.traj.json", "swe-agent/pydicom__pydicom-1458.traj",
              "openhands/multi_swe_bench_examples/output.jsonl", "tau2-bench/gpt-4.1_airline_default_gpt-4.1_1trials.json"]


@pytest.fixture(scope="module")
def real_picks(traces_dir, signals):
    """One real trace per format, parsed once (with its Full-history reference) for every policy."""
    traces = [(rel, next(iter(read_traces(traces_dir / rel)))) for rel in REAL_PICKS]
    return [(rel, trace, full_reference(trace, signals)) for rel, trace in traces]


def _real_trace_marks(name):
    cfg = config_fields(name)  # ReCAP's proxy attention runs the local SmolLM2 model
    return pytest.mark.lm if cfg.get("attention") == "proxy" and cfg.get("use_graph", True) else pytest.mark.slow


@pytest.mark.parametrize("name", [pytest.param(n, marks=_real_trace_marks(n)) for n in names(replay=True)])
def test_every_policy_on_one_real_trace_per_format(real_picks, signals, name):
    policy = {name: create(name, replay=True)}  # oracles included: replay gives them the future
    for rel, trace, reference in real_picks:
        st = replay_trace(trace, policy, 2000, signals, reference=reference).stats[name]
        assert st.violations == [], (rel, name, st.violations[:2])
        if name != "full":
            assert max(st.history_tokens, default=0) <= 2000


@pytest.mark.parametrize("name", ["prune", "observation-masking", "cw-bm25", "recap-recency", "cw-sliding-window",
                                  "contextrender", "contextrender-dep"])
def test_a_render_leaves_no_reference_cycle_behind(name, signals):
    """With the cyclic collector off, a render's layout and its runs are freed by reference
    counting once its rendering is dropped (a layout's runs once held bound methods of the layout:
    a cycle that kept every rendering's layout, units and lists for the collector, in the proxy a
    young collection every few requests; contextrender's deferred reasons held its selection, and
    so the layout, from the layout). Its reasons are still there to read after the render returned.
    Not yet for learned (its deferred reasons hold its layout)."""
    import gc

    from historygraph.render import Layout
    from historygraph.render._units import Runs

    msgs = [Message("system", "s"), Message("user", "task")]
    for i in range(40):
        msgs += [Message("assistant", f"step {i}", (call(f"c{i}"),)),
                 Message("tool", f"result {i} " * 60, tool_call_id=f"c{i}")]
    graph, policy = ContextGraph("cyc", msgs), create(name)
    first = policy.render(graph, 800, signals)  # per-graph state built (kept on purpose, outside this count)
    assert any(r.startswith(("omitted", "dropped", "left out", "selected")) for r in first.reasons.values())
    gc.collect()
    # layouts alive before this render (another test's rendering kept by a graph it still holds, or
    # this policy's first one) are not this render's: count only those made from here on
    before = {id(o) for o in gc.get_objects() if issubclass(type(o), (Layout, Runs))}
    gc.disable()
    try:
        graph.append(Message("assistant", "more", (call("c40"),)))
        graph.append(Message("tool", "result 40 " * 60, tool_call_id="c40"))
        rendering = policy.render(graph, 800, signals)
        assert rendering.omitted  # the budget made it drop or mark steps: runs were used
        del rendering
        # type(), not isinstance: isinstance reads __class__, which makes lazy modules (torch) warn
        alive = [o for o in gc.get_objects() if issubclass(type(o), (Layout, Runs)) and id(o) not in before]
    finally:
        gc.enable()
    assert alive == []


def _grown_event_by_event(draw_steps):
    """Events of a history with late results (after a later message) and second results for an
    answered call, as ``draw_steps`` picks them: ``(kind, k)`` pairs."""
    msgs, open_calls, answered, cid = [Message("system", "s"), Message("user", "task")], [], [], 0
    for kind, k in draw_steps:
        if kind == "calls":
            calls = tuple(call(f"c{cid + i}") for i in range(k))
            cid += k
            msgs.append(Message("assistant", "", calls))
            open_calls += [c.id for c in calls]
        elif kind == "result" and open_calls:  # the oldest open call: late when a message came since
            msgs.append(Message("tool", "out", tool_call_id=open_calls.pop(k % len(open_calls))))
            answered.append(msgs[-1].tool_call_id)
        elif kind == "again" and answered:  # a second result for an answered call (it supersedes the first)
            msgs.append(Message("tool", "real out", tool_call_id=answered[k % len(answered)]))
        elif kind == "user":
            msgs.append(Message("user", f"more {k}"))
        elif kind == "system":
            msgs.append(Message("system", f"note {k}"))
        else:
            msgs.append(Message("assistant", f"text {k}"))
    return msgs


@settings(max_examples=150, deadline=None)
@given(hs.lists(hs.tuples(hs.sampled_from(["calls", "result", "result", "result", "again", "user", "system", "text"]),
                          hs.integers(1, 3)), max_size=40))
def test_stored_facts_follow_the_graph_event_by_event(draw_steps):
    """The facts check_invariants keeps per graph (render order, rank, system and latest user
    positions) equal a fresh reading of the whole graph after every append, late and second
    results included (hypothesis: random event sequences)."""
    counter = TokenCounter()
    g = ContextGraph("facts")
    for m in _grown_event_by_event(draw_steps):
        g.append(m)
        facts = stored_facts(g, counter)
        facts.extend(g)
        order = render_order(g)
        assert facts.order == order
        assert facts.rank == {p: i for i, p in enumerate(order)}
        assert facts.systems == [p for p, x in enumerate(g.messages) if x.role == "system"]
        assert facts.last_user == max((p for p, x in enumerate(g.messages) if x.role == "user"), default=None)


def test_a_checked_rendering_does_not_vouch_for_a_changed_one(signals):
    """What check_invariants keeps between checks (counts and checked stand-ins per position) is
    reused only for the very same message objects: a rendering checked once, then the same one
    with a wrong token figure, or with another altered result at a position whose placeholder
    passed, is refused."""
    msgs = [Message("system", "s"), Message("user", "task")]
    for i in range(12):
        msgs += [Message("assistant", f"step {i}", (call(f"c{i}"),)), Message("tool", f"result {i} " * 80, tool_call_id=f"c{i}")]
    g = ContextGraph("vouch", msgs)
    r = create("prune").render(g, 600, signals)
    check_invariants(r, g, signals.counter)
    check_invariants(r, g, signals.counter)  # the same rendering again: still fine
    k = next(i for i, m in enumerate(r.messages) if m.rendered_as == "placeholder")
    wrong = Rendering(r.policy, r.budget, list(r.messages), list(r.positions), list(r.full), list(r.omitted),
                      list(r.dropped), r.history_tokens + 1, r.input_tokens)
    with pytest.raises(InvariantError, match="recount"):
        check_invariants(wrong, g, signals.counter)
    altered = Message("tool", "something else", tool_call_id=r.messages[k].tool_call_id, rendered_as="placeholder")
    cut = list(r.messages)
    cut[k] = altered
    tokens = sum(signals.counter.count_message(m) for m, p in zip(cut, r.positions) if p not in (0, 1))  # system, user: outside B
    bad = Rendering(r.policy, r.budget, cut, list(r.positions), list(r.full), list(r.omitted), list(r.dropped), tokens, 0)
    with pytest.raises(InvariantError, match="§5.3 complete"):
        check_invariants(bad, g, signals.counter)
