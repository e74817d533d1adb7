"""The execution state survives (issue 48, item 4; docs/architecture.md, invariant §5.10): the
assistant message of the agent's latest todo list or plan (Claude Code's ``TodoWrite``, Codex's
``update_plan``) is shown, with its calls, in every rendering of every policy; older versions
need not be."""

from __future__ import annotations

import json

import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.render import InvariantError, Rendering, check_invariants
from historygraph.render._facts import stored_facts
from historygraph.render.invariants import INVARIANTS, check_newest_shown, check_plan_shown
from historygraph.render.plan import latest_plan
from historygraph.traces import read_traces

from doubles import MODEL_FREE, ScriptedModel, TableScorer


@pytest.fixture(scope="module")
def signals():
    # summarising policies get a deterministic test-double model: the plan concerns what is shown
    return Signals(model_factory=ScriptedModel, scorer_factory=TableScorer)


def todo(cid: str, *items: str) -> ToolCall:
    return ToolCall(cid, "TodoWrite", json.dumps({"todos": [{"content": t, "status": "pending", "activeForm": t} for t in items]}))


def planned_history() -> list[Message]:
    """A task, a todo list at position 2, eight steps of ~300-token listings, a second todo list
    at position 20 (superseding the first), four more steps."""
    msgs = [Message("system", "You are a coding agent."), Message("user", "Rename the config loader.")]
    msgs += [Message("assistant", "Planning.", (todo("t1", "find the loader", "rename it"),)),
             Message("tool", "Todos have been modified successfully.", tool_call_id="t1")]
    for i in range(8):
        msgs += [Message("assistant", f"step {i}", (ToolCall(f"c{i}", "Bash", json.dumps({"command": f"ls d{i}"})),)),
                 Message("tool", " ".join(f"file{i}_{k}.py" for k in range(150)), tool_call_id=f"c{i}")]
    msgs += [Message("assistant", "Found it; updating the plan.", (todo("t2", "rename load_config", "run the tests"),)),
             Message("tool", "Todos have been modified successfully.", tool_call_id="t2")]
    for i in range(8, 12):
        msgs += [Message("assistant", f"step {i}", (ToolCall(f"c{i}", "Bash", json.dumps({"command": f"ls d{i}"})),)),
                 Message("tool", " ".join(f"file{i}_{k}.py" for k in range(150)), tool_call_id=f"c{i}")]
    return msgs


def test_the_latest_plan_is_the_last_todo_or_plan_call_as_the_graph_grows():
    msgs = planned_history()
    g = ContextGraph("plan")
    seen = []
    for m in msgs:
        g.append(m)
        seen.append(latest_plan(g))
    assert seen[1] is None and seen[2] == 2 and seen[19] == 2 and seen[20] == 20 and seen[-1] == 20
    codex = ContextGraph("codex", [Message("user", "u"), Message("assistant", "", (ToolCall("p", "update_plan", '{"plan": []}'),))])
    assert latest_plan(codex) == 1


def test_the_checker_catches_a_rendering_without_the_latest_plan(signals):
    assert INVARIANTS.index(check_plan_shown) == INVARIANTS.index(check_newest_shown) + 1  # run by check_invariants
    msgs = planned_history()
    g = ContextGraph("plan", msgs)
    whole = create("prune").render(g, None, signals)
    keep = [i for i, p in enumerate(whole.positions) if p not in (20, 21)]
    cut = Rendering("x", None, [whole.messages[i] for i in keep], [whole.positions[i] for i in keep], [], [], [20, 21], 0, 0)
    with pytest.raises(InvariantError, match="§5.10 plan: the agent's latest plan \\(message 20\\) was left out"):
        check_plan_shown(cut, g, signals.counter, stored_facts(g, signals.counter), {0})
    first = ContextGraph("first", msgs[:20])  # the first plan is the latest one here: shown, it passes
    check_invariants(create("prune").render(first, None, signals), first, signals.counter)


def test_the_checker_catches_a_rendering_without_the_latest_step_whole(signals):
    """§5.10's latest step: the latest assistant message left out, or shown in brief view (its text
    replaced), breaks it; shown as stored, or as verbatim segments (ReCAP §4.4's ablations), holds."""
    from historygraph.render.invariants import check_latest_step_shown
    from historygraph.render.markers import SEGMENT_JOIN

    assert check_latest_step_shown in INVARIANTS
    g = ContextGraph("step", [Message("user", "task"), Message("assistant", "I will look at f.py first",
                                                                     (ToolCall("c1", "bash", '{"cmd": "cat f.py"}'),)),
                              Message("tool", "def f(): pass", tool_call_id="c1")])
    facts = stored_facts(g, signals.counter)
    whole = create("prune").render(g, None, signals)
    check_latest_step_shown(whole, g, signals.counter, facts, {0})
    brief = g.messages[1].with_content("[step #1]", "brief")
    shown = Rendering("x", None, [g.messages[0], brief, g.messages[2]], [0, 1, 2], [2], [], [], 0, 0)
    with pytest.raises(InvariantError, match="§5.10 latest step: the latest assistant message \\(message 1\\) was shown as brief"):
        check_latest_step_shown(shown, g, signals.counter, facts, {0})
    gone = Rendering("x", None, [g.messages[0]], [0], [], [], [1, 2], 0, 0)
    with pytest.raises(InvariantError, match="was left out"):
        check_latest_step_shown(gone, g, signals.counter, facts, {0})
    plain = ContextGraph("plain", [Message("user", "u"), Message("assistant", "alpha\nbeta\ngamma")])
    pieces = plain.messages[1].with_content("alpha" + SEGMENT_JOIN + "gamma", "segments")
    check_latest_step_shown(Rendering("x", None, [plain.messages[0], pieces], [0, 1], [], [], [], 0, 0), plain,
                            signals.counter, stored_facts(plain, signals.counter), {0})


@pytest.mark.parametrize("name", MODEL_FREE)
def test_every_policy_shows_the_latest_todo_list_of_a_real_claude_code_session(name, sessions_dir, signals):
    """A real Claude Code session with five TodoWrite calls (messages 121-…) replayed at B = 8000
    from its first todo list on: at every call the message of the latest TodoWrite (found here by
    its tool name) is rendered with its calls, and every invariant holds. Before §5.10, learned
    left it out at 54 of those 60 calls, prune at 29, recap-noattn at 50."""
    path = sessions_dir / "claude-code" / "entireio__cli__15b634ab-64a9-41da-92d3-685a0e4f2960.jsonl.gz"
    trace = next(iter(read_traces(path)))
    plans = [p for p, m in enumerate(trace.messages) if any(c.name == "TodoWrite" for c in m.tool_calls)]
    assert len(plans) == 5
    policy, g, latest, calls = create(name), ContextGraph("todo"), None, 0
    count = signals.counter.count_message
    assert sum(count(m) for m in trace.messages[2:]) > 8000  # the budget makes every policy leave history out
    for m in trace.messages:
        if m.role == "assistant" and latest is not None:
            r = policy.render(g, 8000, signals)
            check_invariants(r, g, signals.counter)
            shown = dict(zip(r.positions, r.messages))
            assert latest in shown and shown[latest].tool_calls == g.messages[latest].tool_calls, (name, len(g))
            calls += 1
        if any(c.name == "TodoWrite" for c in m.tool_calls):
            latest = len(g)
        g.append(m)
    assert calls == 60
