"""``learned``'s ``recent_calls``: the newest steps shown with their calls, in the compact form of
``Selection.revive_recent`` (short brief view, short placeholders naming the ids), checked by hand
on a small history and on a real mini-swe-agent trace."""

from __future__ import annotations

from historygraph.eval.recent import _shown
from historygraph.eval.replay import replay_trace
from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.policies.learned.policy import LearnedConfig
from historygraph.render import Layout, check_invariants
from historygraph.signals.tokens import TokenCounter


def steps(n: int, big: int | None = None) -> list[Message]:
    """A task, then ``n`` steps: an assistant message with a long text and one call ``c{i}``, and its
    result. Step ``i`` sits at position ``1 + 2i``, its result at ``2 + 2i``. Step ``big`` (if any)
    writes a long file in its call."""
    msgs = [Message("user", "Fix the parser.")]
    for i in range(n):
        command = f"cat src/f{i}.py" if i != big else "cat > big.py << 'EOF'\n" + "x = compute(y)\n" * 120 + "EOF"
        msgs.append(Message("assistant", f"THOUGHT: step {i} reads the next file to find the bug. " * 8,
                            (ToolCall(f"c{i}", "bash", '{"command": %r}' % command),)))
        msgs.append(Message("tool", f"line {i} of the output\n" * 40, tool_call_id=f"c{i}"))
    return msgs


def test_revive_recent_shows_the_newest_calls_with_short_stand_ins_naming_every_id() -> None:
    counter = TokenCounter()
    g = ContextGraph("compact", steps(10))
    lay = Layout(g, counter, 1500, result_reserve=0.95, brief_revivals=True)
    assert {1 + 2 * i for i in range(9)} <= {lay.units[u].positions[0] for u in lay.dropped_units}  # all but the latest dropped
    sel = lay.selection()
    assert sel.revive_recent(5) == 5
    r = lay.assemble("t", sel)
    check_invariants(r, g, counter)
    at = {p: m for m, p in zip(r.messages, r.positions) if p is not None}
    for i in range(5, 9):  # the four newest before the latest: calls as stored, text and result as short stand-ins
        a, res = at[1 + 2 * i], at[2 + 2 * i]
        assert a.tool_calls == g.messages[1 + 2 * i].tool_calls
        assert (a.content, a.rendered_as) == (f"[text omitted; restore by message number #{1 + 2 * i}]", "brief")
        assert (res.content, res.rendered_as) == (f"[tool result c{i} omitted; restore by id]", "placeholder")
    assert at[19] is g.messages[19] and at[20] is g.messages[20]  # the latest step and its result, whole
    # the older steps are left out under one dropped-step marker naming their message numbers
    markers = [m.content for m in r.messages if m.rendered_as == "marker"]
    assert markers == ["[omitted: messages #1–#10, tool calls: 5; stored in full, restore by message number]"]
    assert not set(range(1, 11)) & set(r.positions)
    # the running count is the rendering's, recounted
    assert r.history_tokens == sel.used
    # showing a stubbed result costs its tokens less the short placeholder's (what the stub saved is charged back)
    stub = Message("tool", "[tool result c6 omitted; restore by id]", tool_call_id="c6")
    assert sel.cost(14) == counter.count_message(g.messages[14]) - counter.count_message(stub)
    sel.take(14)
    r = lay.assemble("t", sel)
    check_invariants(r, g, counter)
    assert r.messages[r.positions.index(14)] is g.messages[14] and r.history_tokens == sel.used


def test_a_newest_step_larger_than_the_limit_stays_in_its_marker() -> None:
    counter = TokenCounter()
    g = ContextGraph("limit", steps(20, big=17))  # step 17 (position 35) writes a long file
    lay = Layout(g, counter, 3000, result_reserve=0.95, brief_revivals=True)
    assert counter.count_message(g.messages[35].with_content("", "brief")) > 300  # its call alone is over the limit below
    sel = lay.selection()
    assert sel.revive_recent(5, limit=300) == 4
    r = lay.assemble("t", sel)
    check_invariants(r, g, counter)
    assert 35 not in r.positions and {31, 33, 37, 39} <= set(r.positions)
    markers = [m.content for m in r.messages if m.rendered_as == "marker"]
    assert markers == ["[omitted: messages #1–#30, tool calls: 15; stored in full, restore by message number]",
                       "[omitted: messages #35–#36, tool calls: 1; stored in full, restore by message number]"]
    assert r.history_tokens == sel.used
    sel = lay.selection()  # with no limit it comes back too
    assert sel.revive_recent(5) == 5 and 35 in lay.assemble("t", sel).positions


def test_the_defaults_leave_the_newest_steps_to_the_selection() -> None:
    """Not the default yet (over the 2 points at B = 3000, docs/learned.md); 0.1 is the share measured for 5."""
    assert (LearnedConfig().recent_calls, LearnedConfig().recent_step_share) == (0, 0.1)


def newest_shown(trace, **config) -> tuple[list[int], int]:  # noqa: ANN001 - a Trace
    """Per counted call of ``trace`` replayed through ``learned`` at B = 6000, how many of the 5
    newest assistant messages its rendering shows with their calls, and the reuse events it shows."""
    res = replay_trace(trace, {"l": create("learned", replay=True, **config)}, 6000, Signals())
    st = res.stats["l"]
    assert not st.violations
    return st.recent.calls[5], st.hits


def test_recent_calls_shows_the_five_newest_calls_at_every_call_of_a_real_trace(traces_dir) -> None:
    """sqlfluff__sqlfluff-1625 (42 calls with 5 assistant messages before them, B = 6000): with
    ``recent_calls=5`` the 5 newest are shown with their calls at all 42 (17 with ``recent_calls=0``), the same 11 of
    its 12 reuse events shown. On django__django-11964 a few steps write whole files (over 0.1·B):
    with no limit all 5 at each of its 98 calls (14 without ``recent_calls``)."""
    from historygraph.traces import read_traces

    folder = traces_dir / "mini-swe-agent-deepseek"
    (t,) = read_traces(folder / "sqlfluff__sqlfluff-1625.traj.json")
    shown, hits = newest_shown(t, recent_calls=5)
    assert (len(shown), shown.count(5), hits) == (42, 42, 11)
    shown, hits = newest_shown(t, recent_calls=0)
    assert (len(shown), shown.count(5), hits) == (42, 17, 11)
    (t,) = read_traces(folder / "django__django-11964.traj.json")
    shown, _ = newest_shown(t, recent_calls=5, recent_step_share=1.0)
    assert (len(shown), shown.count(5)) == (98, 98)
    shown, _ = newest_shown(t, recent_calls=0)
    assert shown.count(5) == 14


def test_the_compact_form_is_what_eval_recent_counts_as_shown_calls() -> None:
    """A rendering of ``learned`` on a long history (B = 1500) shows the newest 5 with their calls as
    ``eval.recent`` counts them (calls as stored), and its placeholders of those steps are the short ones."""
    counter = TokenCounter()
    g = ContextGraph("count", steps(14))
    r = create("learned", recent_calls=5).render(g, 1500, Signals())
    check_invariants(r, g, counter)
    assistants = [p for p, m in enumerate(g.messages) if m.role == "assistant"]
    at = {p: m for m, p in zip(r.messages, r.positions) if p is not None}
    assert _shown(assistants[-5:], g.messages, at, calls_only=True) == 5
    assert _shown(assistants[-5:], g.messages, at) < 5  # in brief view: not their text
    for p in assistants[-5:-1]:
        res = at[p + 1]
        assert res is g.messages[p + 1] or res.content == f"[tool result {g.messages[p + 1].tool_call_id} omitted; restore by id]"
