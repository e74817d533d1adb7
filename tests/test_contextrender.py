"""ContextRender usefulness and greedy selection (§3.3, A.1, A.3, A.4); values computed by hand."""

import json
import math
import re

import numpy as np
import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.policies.contextrender import ContextRenderConfig, usefulness
from historygraph.render import check_invariants
from historygraph.signals.tokens import TokenCounter


def test_usefulness_hand_computed():
    # age 2, c = 1.5, s = 0.4 with A.3 defaults: e^-0.6 + (1 - e^-0.3) + 0.4
    #   = 0.5488116 + 0.2591818 + 0.4 = 1.2079934
    assert usefulness(2, 1.5, 0.4, ContextRenderConfig()) == pytest.approx(1.2079934, abs=1e-6)
    # recency-only ablation (B.3): only e^-0.6 remains
    assert usefulness(2, 1.5, 0.4, ContextRenderConfig(w_reuse=0, w_rel=0)) == pytest.approx(0.5488116, abs=1e-6)


class TableEmbedder:
    """Test double: returns fixed unit vectors looked up by a marker word in the text."""

    model, dim = "table", 3

    def __init__(self, table):
        self.table = table

    def embed(self, texts):
        out = []
        for t in texts:
            key = next((k for k in self.table if k in t), None)
            v = np.array(self.table[key] if key else [0.0, 0.0, 1.0], dtype=np.float32)
            out.append(v / np.linalg.norm(v))
        return np.stack(out) if out else np.zeros((0, 3), np.float32)


def _signals(table):
    return Signals(counter=TokenCounter(), embedder_factory=lambda: TableEmbedder(table))


def _trace(results):
    """user, then one assistant call + result per entry of ``results``; then the user asks again."""
    msgs = [Message("user", "QUERY task")]
    for i, text in enumerate(results):
        msgs.append(Message("assistant", "", (ToolCall(f"c{i}", "t", "{}"),)))
        msgs.append(Message("tool", text, tool_call_id=f"c{i}"))
    return ContextGraph("g", msgs)


def _budget_for(graph, counter, n_full):
    """A budget that fits the base history plus exactly the ``n_full`` largest result deltas."""
    from historygraph.render import Layout
    lay = Layout(graph, counter, None)
    deltas = sorted(lay.delta.values(), reverse=True)
    return lay.base_tokens + sum(deltas[:n_full]), lay


def test_exact_tie_goes_to_the_older_result():
    # Two results with identical text length, the same vector as the query, relevance-only weights:
    # U is exactly 1.0 for both, so the older one (position 2) must win; the other then has R = 0.5
    # but does not fit.
    # A last short step ("ok", position 6) is the newest result, always shown (invariant §5.9): the
    # budget holds it too, so that the two tied results compete for one place.
    g = _trace(["SAME aaaa " * 50, "SAME bbbb " * 50, "ok"])
    sig = _signals({"SAME": [1, 0, 0], "QUERY": [1, 0, 0], "ok": [0, 1, 0]})
    B, lay = _budget_for(g, sig.counter, 1)
    B += lay.delta[6]
    r = create("cr-relevance").render(g, B, sig)
    assert r.full == [2, 6]
    check_invariants(r, g, sig.counter)


def test_candidate_that_does_not_fit_is_skipped():
    # BIG is most relevant but too large; SMALL (less relevant) still gets selected.
    g = _trace(["BIG " + "x " * 600, "SMALL " + "y " * 80, "OTHER " + "z " * 80])
    g.append(Message("assistant", "thinking " * 700))  # a long retained message: BIG alone is below B
    sig = _signals({"BIG": [1, 0, 0], "SMALL": [0.6, 0.8, 0], "OTHER": [0, 1, 0], "QUERY": [1, 0, 0]})
    from historygraph.render import Layout
    lay = Layout(g, sig.counter, None)
    B = lay.base_tokens + lay.delta[4] + 1  # room for SMALL only
    r = create("cr-relevance").render(g, B, sig)
    assert 2 not in r.full and 4 in r.full
    assert r.history_tokens <= B
    assert "not selected" in r.reasons[2]


def test_similarity_penalty_prefers_a_different_result():
    # A and A2 are identical in direction (cos 1) and most relevant; C is less relevant but different.
    # After A (R = 1.0), A2 has R = 1.0 - 0.5 = 0.5 < C's 0.8, so C is chosen second.
    g = _trace(["A1 " + "a " * 80, "A2 " + "b " * 80, "C " + "c " * 80])
    sig = _signals({"A1": [1, 0, 0], "A2": [1, 0, 0], "C": [0.8, 0.6, 0], "QUERY": [1, 0, 0]})
    from historygraph.render import Layout
    lay = Layout(g, sig.counter, None)
    B = lay.base_tokens + lay.delta[2] + lay.delta[6]
    r = create("cr-relevance").render(g, B, sig)
    assert r.full == [2, 6]


def test_full_history_returned_unchanged_when_it_fits():
    g = _trace(["one", "two"])
    sig = _signals({})
    r = create("contextrender").render(g, 10_000, sig)
    assert r.messages == g.messages and r.omitted == []


def test_oversized_result_becomes_a_marked_excerpt():
    big = "line of output number\n" * 3000
    g = _trace([big, "small"])
    sig = _signals({})
    r = create("contextrender").render(g, 800, sig)
    check_invariants(r, g, sig.counter)
    shown = [m for m in r.messages if m.role == "tool" and m.tool_call_id == "c0"][0]
    assert shown.rendered_as == "excerpt" and "c0" in shown.content and "truncated" in shown.content
    assert 2 not in r.full  # an excerpt never counts as the complete result
    assert g.messages[2].content == big  # the stored original is untouched


def test_a_result_dropped_with_its_step_says_so():
    # 6 steps of a 600-token thought + a 10-token result: the retained non-tool history (~3,700
    # tokens) is over (1 − 0.5)·B at B = 2,000, so the oldest steps are dropped whole (A.4, our
    # reserve); the reason of a dropped result names the drop, then the policy's own decision.
    msgs = [Message("user", "QUERY task")]
    for i in range(6):
        msgs += [Message("assistant", "thinking " * 600, (ToolCall(f"c{i}", "t", "{}"),)),
                 Message("tool", f"r{i} " + "y " * 8, tool_call_id=f"c{i}")]
    g = ContextGraph("g", msgs)
    sig = _signals({"QUERY": [1, 0, 0]})
    r = create("contextrender").render(g, 2000, sig)
    check_invariants(r, g, sig.counter)
    assert 1 in r.dropped and 2 in r.dropped and 2 in r.omitted
    assert r.reasons[1].startswith("dropped: retained non-tool history")
    assert r.reasons[2].startswith("dropped with its step: retained non-tool history")
    # showing it would revive its 600-token step, which does not fit: the usefulness reason follows
    assert "; the policy had decided: omitted: U=" in r.reasons[2] and "not selected within B" in r.reasons[2]
    cost, left = map(int, re.search(r"would add (\d+) tokens, (\d+) of B unused", r.reasons[2]).groups())
    assert cost > 600 and cost > left and left == 2000 - r.history_tokens  # the step's thought is charged too
    # the revived-or-kept steps and the current user message say why they are there
    assert r.reasons[0] == "outside B: current user message (the latest, which the steps after it answer)"


def test_dependency_term_prefers_the_ancestor_result():
    # Steps: 0 reads a.py, 1 and 2 share nothing with the in-flight step 3, which edits a.py, so
    # step 0 is its only low-cost parent (shared file). Results are orthogonal to the query (s = 0)
    # and reuse nothing (c = 0), so U = e^{-0.3·age}: the newest result wins in ContextRender, and
    # the +0.5 of contextrender-dep outweighs the recency gap e^{-0.3·a}(1 − e^{-0.6}) ≤ 0.451.
    msgs = [Message("user", "QUERY task")]
    for i, cmd in enumerate(["cat a.py", "ls", "pwd"]):
        msgs += [Message("assistant", "", (ToolCall(f"c{i}", "bash", json.dumps({"command": cmd})),)),
                 Message("tool", f"output {i} " + "zz " * 150, tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "", (ToolCall("c3", "bash", json.dumps({"command": "sed -i s/x/y/ a.py"})),)))
    g = ContextGraph("dep", msgs)
    sig = _signals({"QUERY": [1, 0, 0]})
    B, _ = _budget_for(g, sig.counter, 1)
    plain = create("contextrender").render(g, B, sig)
    dep = create("contextrender-dep").render(g, B, sig)
    check_invariants(dep, g, sig.counter)
    assert plain.full == [6] and dep.full == [2]
    a0 = g.age(2)
    assert f"U={math.exp(-0.3 * a0) + 0.5:.3f}" in dep.reasons[2] and "ancestor +0.5" in dep.reasons[2]


def test_a_step_brought_back_by_its_result_says_so():
    # As above with 300-token thoughts and B = 1,500: the oldest steps are dropped (target 750), then
    # step 0's result, the only one relevant to the query (s = 1, U = e^{-0.3·5} + 1 = 1.22 against
    # at most 1.0 for the others), is selected first and brings its step back.
    msgs = [Message("user", "QUERY task")]
    for i in range(6):
        msgs += [Message("assistant", "thinking " * 300, (ToolCall(f"c{i}", "t", "{}"),)),
                 Message("tool", ("KEY " if i == 0 else f"r{i} ") + "y " * 8, tool_call_id=f"c{i}")]
    g = ContextGraph("g", msgs)
    sig = _signals({"QUERY": [1, 0, 0], "KEY": [1, 0, 0]})
    r = create("contextrender").render(g, 1500, sig)
    check_invariants(r, g, sig.counter)
    assert 2 in r.full and 1 not in r.dropped and 3 in r.dropped
    assert r.reasons[1].startswith("kept: brought back because a result of its step is shown")
    assert r.reasons[2].startswith("selected #1: U=1.223")


def test_reserve_layout_shows_both_relevant_results_where_the_published_layout_shows_one():
    # Six steps with 300-token thoughts and 100-token results; results 0 and 1 hold KEY (s = 1).
    # Published layout at B = 1,500: non-tool history is over B, so the oldest steps are dropped to
    # B/2 (steps 4 and 5 stay). Result 1 (U = e^{-0.3·4} + 1 = 1.301) brings step 1 back at its full
    # ~300 tokens; then results 5 (U = 1.0) and 4 (e^{-0.3} = 0.741); result 0 (U = 1.223) would bring
    # back step 0's 300 tokens too and no longer fits. Under the reserve layout (5 % of B for non-tool
    # history) every step is dropped but the latest, and a step comes back as its call plus a
    # ~20-token marker, so all six results fit, both KEY results among them.
    msgs = [Message("user", "QUERY task")]
    for i in range(6):
        msgs += [Message("assistant", "thinking " * 300, (ToolCall(f"c{i}", "t", "{}"),)),
                 Message("tool", ("KEY " if i < 2 else f"r{i} ") + "y " * 100, tool_call_id=f"c{i}")]
    g = ContextGraph("reserve", msgs)
    sig = _signals({"QUERY": [1, 0, 0], "KEY": [1, 0, 0]})
    published = create("contextrender").render(g, 1500, sig)
    reserve = create("contextrender-reserve").render(g, 1500, sig)
    for r in (published, reserve):
        check_invariants(r, g, sig.counter)
        assert r.history_tokens <= 1500
    assert published.full == [4, 10, 12] and published.reasons[4].startswith("selected #1: U=1.301")
    assert reserve.full == [2, 4, 6, 8, 10, 12] and reserve.reasons[2].startswith("selected #3: U=1.223")
    shown = dict(zip(reserve.positions, reserve.messages))
    assert [shown[p].rendered_as for p in (1, 3, 5, 7, 9, 11)] == ["brief"] * 5 + [None]
    assert shown[1].tool_calls == msgs[1].tool_calls and "restore by message number #1" in shown[1].content


def test_reserve_share_out_of_range_is_refused():
    with pytest.raises(ValueError, match="result_reserve must be in"):
        ContextRenderConfig(result_reserve=1.0)
