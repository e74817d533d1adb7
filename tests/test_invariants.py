"""docs/architecture.md §5 over every registered policy, on synthetic edge cases and on real traces."""

import pytest

from historygraph.events import Message, ToolCall
from historygraph.eval.replay import full_reference, replay_trace
from historygraph.formats import read_traces
from historygraph.graph import ContextGraph
from historygraph.policies import Signals, config_fields, create, names
from historygraph.render import BudgetTooSmallError, InvariantError, Rendering, check_invariants

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

    from historygraph.render import Layout, _Runs

    msgs = [Message("system", "s"), Message("user", "task")]
    for i in range(40):
        msgs += [Message("assistant", f"step {i}", (call(f"c{i}"),)),
                 Message("tool", f"result {i} " * 60, tool_call_id=f"c{i}")]
    graph, policy = ContextGraph("cyc", msgs), create(name)
    first = policy.render(graph, 800, signals)  # per-graph state built (kept on purpose, outside this count)
    assert any(r.startswith(("omitted", "dropped", "left out", "selected")) for r in first.reasons.values())
    gc.collect()
    gc.disable()
    try:
        graph.append(Message("assistant", "more", (call("c40"),)))
        graph.append(Message("tool", "result 40 " * 60, tool_call_id="c40"))
        rendering = policy.render(graph, 800, signals)
        assert rendering.omitted  # the budget made it drop or mark steps: runs were used
        del rendering
        # type(), not isinstance: isinstance reads __class__, which makes lazy modules (torch) warn
        alive = [o for o in gc.get_objects() if issubclass(type(o), (Layout, _Runs))]
    finally:
        gc.enable()
    assert alive == []
