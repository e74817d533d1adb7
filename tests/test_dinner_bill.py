"""The dinner-bill scenario of ContextRender §2 (Figure 2), shipped as the example trace.

At turn 18 the agent needs Nancy's e-mail, found only in the contact result of turn 8. That
result was reused at turns 10, 15 and 16 (gmail.com, tr_solo), so ContextRender keeps it, while
Prune, which keeps the newest results, has filled B with later results and drops it.
"""

import pytest

from historygraph.cli.common import example_trace_path
from historygraph.traces import read_traces
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.render import check_invariants


@pytest.fixture(scope="module")
def late_turn():
    (trace,) = list(read_traces(example_trace_path()))
    assistants = [i for i, m in enumerate(trace.messages) if m.role == "assistant"]
    j = assistants[17]  # turn 18
    assert "nan_ritt@gmail.com" in trace.messages[j].tool_calls[0].arguments
    graph = ContextGraph("dinner", trace.messages[:j])
    return graph, graph.result_of["call_08"]


def test_contact_result_reuse_score(late_turn):
    graph, contact = late_turn
    # Uses before turn 18: gmail.com at turns 10 (login e-mail), 15 and 16; tr_solo at 16 -> 4 matches.
    # gmail.com and tr_solo are each held by two results by then (contacts, friends list): 4 × 1/2.
    assert graph.reuse_score(contact) == pytest.approx(2.0)


def test_contextrender_keeps_what_prune_drops(late_turn):
    graph, contact = late_turn
    sig = Signals()
    cr = create("contextrender").render(graph, 3000, sig)
    pr = create("prune").render(graph, 3000, sig)
    for r in (cr, pr):
        check_invariants(r, graph, sig.counter)
        assert r.history_tokens <= 3000
    assert contact in cr.full
    assert contact not in pr.full
    assert "nan_ritt@gmail.com" in "".join(m.content for m in cr.messages)
