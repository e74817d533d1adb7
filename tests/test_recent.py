"""The newest assistant messages a rendering shows (eval.recent), counted by hand."""

from __future__ import annotations

from historygraph.eval.recent import RecentCounts, _shown, shown_newest
from historygraph.eval.replay import replay_trace
from historygraph.history.events import Message, ToolCall, Trace
from historygraph.policies import Signals, create


def history(steps: int) -> list[Message]:
    msgs = [Message("user", "task")]
    for i in range(steps):
        msgs += [Message("assistant", f"step {i}", (ToolCall(f"c{i}", "bash", '{"command": "ls"}'),)),
                 Message("tool", f"out {i}", tool_call_id=f"c{i}")]
    return msgs


def test_shown_newest_counts_messages_kept_whole() -> None:
    stored = history(6)  # assistant messages at 1, 3, 5, 7, 9, 11
    assistants = [1, 3, 5, 7, 9, 11]
    brief = stored[9].with_content("step", "excerpt")  # cut to a brief view: not shown
    rendered = [stored[0], stored[5], stored[6], stored[7], stored[8], brief, stored[10], stored[11], stored[12]]
    positions = [0, 5, 6, 7, 8, 9, 10, 11, 12]
    # the five newest are 3, 5, 7, 9, 11: 5, 7 and 11 shown whole, 3 left out, 9 cut
    assert shown_newest(assistants, stored, rendered, positions, 5) == 3
    assert shown_newest(assistants, stored, rendered, positions, 10) is None  # only six before the call
    c = RecentCounts()
    c.observe(assistants, stored, rendered, positions)
    c.observe(assistants, stored, (), ())  # a budget error shows nothing
    # with calls only, the cut 9 (calls as stored) counts too: 4 and 0
    # neither call shows all five: the share of calls with all 5 is 0 %
    assert c.columns() == {"recent5_median": 1.5, "recent5_min": 0, "recent5_all": 0.0, "recent10_median": None,
                           "recent10_min": None, "recent10_all": None, "recent5_calls_median": 2.0, "recent5_calls_min": 0, "recent10_calls_median": None,
                           "recent10_calls_min": None}


def test_full_history_shows_every_recent_step_in_a_replay() -> None:
    t = Trace("openai-chat", "t", "t.json", history(12) + [Message("assistant", "done")])
    res = replay_trace(t, {"full": create("full", replay=True)}, 100_000, Signals())
    cols = res.stats["full"].recent.columns()
    # calls 6..13 have at least 5 assistant messages before them, 11..13 at least 10: all shown
    assert res.stats["full"].recent.shown == {5: [5] * 8, 10: [10] * 3}
    assert (cols["recent5_min"], cols["recent10_min"], cols["recent5_all"], cols["recent10_all"]) == (5, 10, 100.0, 100.0)


def test_learned_with_recent_steps_keeps_the_newest_steps_whole(traces_dir) -> None:
    """The issue's trajectory (django__django-11964, 103 calls, B = 6000): without ``recent_calls``
    (the compact newest steps, tests/test_recent_calls.py; 0 by default) ``learned`` shows a median of 2
    of its 5 newest assistant messages whole; with ``recent_steps=5`` all 5 at every call, for 9 of
    173 reuse events (141 → 132 shown)."""
    from historygraph.traces import read_traces

    (t,) = read_traces(traces_dir / "mini-swe-agent-deepseek" / "django__django-11964.traj.json")
    got = {}
    for n in (0, 5):
        res = replay_trace(t, {"r": create("learned", replay=True, recent_steps=n, recent_calls=0)}, 6000, Signals())
        got[n] = (res.stats["r"].recent.columns(), res.stats["r"].hits)
        assert not res.stats["r"].violations
    assert (got[0][0]["recent5_median"], got[5][0]["recent5_median"], got[5][0]["recent5_min"]) == (2, 5, 5)
    assert (got[0][1], got[5][1]) == (141, 132)


def test_a_brief_view_counts_as_shown_calls_but_not_as_shown_text():
    """A message in brief view (tool calls as stored, text replaced by a marker) counts in the
    calls measure and not in the text one; a message left out counts in neither."""
    from historygraph.eval.recent import RecentCounts
    from historygraph.history.events import Message, ToolCall

    stored = [Message("user", "task")]
    assistants = []
    for i in range(5):
        assistants.append(len(stored))
        stored.append(Message("assistant", f"thinking {i}", tool_calls=(ToolCall(id=f"c{i}", name="sh", arguments="{}"),)))
        stored.append(Message("tool", "out", tool_call_id=f"c{i}"))
    brief = stored[3].with_content("[text omitted]", "brief")
    shown = [(stored[0], 0), (brief, 3), (stored[5], 5), (stored[7], 7), (stored[9], 9)]  # #1 left out, #3 brief
    counts = RecentCounts()
    counts.observe(assistants, stored, [m for m, _ in shown], [p for _, p in shown])
    cols = counts.columns()
    assert (cols["recent5_median"], cols["recent5_calls_median"]) == (3.0, 4.0)
    assert (cols["recent5_min"], cols["recent5_calls_min"]) == (3, 4)


def test_learned_brings_the_newest_steps_back_in_brief_view_with_recent_calls() -> None:
    """``learned``'s ``recent_calls=N``: the steps of the N newest assistant messages are shown with
    their tool calls at every call of a history whose old steps are dropped (without it they are
    left out), and every rendering holds the invariants."""
    from historygraph.history.graph import ContextGraph
    from historygraph.render.invariants import check_invariants

    stored = [Message("user", "Fix the bug in the parser. " * 5)]
    for i in range(12):
        stored.append(Message("assistant", f"THOUGHT: step {i} looks at file_{i}. " * 6,
                              tool_calls=(ToolCall(id=f"c{i}", name="bash", arguments=f'{{"command": "cat f{i}.py"}}'),)))
        stored.append(Message("tool", f"line {i} of output\n" * 60, tool_call_id=f"c{i}"))
    sig = Signals()
    counts = {}
    for n in (0, 5):
        policy, g, shown = create("learned", recent_calls=n), ContextGraph("r"), []
        for m in stored:
            if m.role == "assistant" and len(g) > 12:
                r = policy.render(g, 1500, sig)
                check_invariants(r, g, sig.counter)
                assistants = [p for p, x in enumerate(g.messages) if x.role == "assistant"]
                shown.append(_shown(assistants[-5:], g.messages, {p: x for x, p in zip(r.messages, r.positions) if p is not None},
                                    calls_only=True))
            g.append(m)
        counts[n] = shown
    assert min(counts[5]) == 5 and min(counts[0]) < 5
