"""Focused excerpts (issue 39, item 3): an oversized result keeps the lines holding the values the
agent is working on, with its head and tail, within its share, naming its id (docs/policies.md)."""

import re

import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.render import EXCERPT_MARK, Layout, check_invariants, excerpt_for
from historygraph.render.focus import focus_values
from historygraph.render.markers import FOCUS_MARK, GAP_MARK
from historygraph.signals.tokens import TokenCounter

TARGET = "    def separability_matrix(transform):  # where the bug is"
FILLER = "line {i}: plain filler text of a long file listing, nothing to see"


def big_file(n=1000, at=537):
    lines = [FILLER.format(i=i) for i in range(n)]
    lines[at] = TARGET
    return "\n".join(lines)


def pieces_in_order(excerpt: str, original: str) -> bool:
    """The excerpt, its marks taken out, is pieces of the original in order."""
    marks = "|".join(re.escape(t).replace(r"\{id\}", ".+?").replace(r"\{kept\}", r"\d+").replace(r"\{total\}", r"\d+")
                     .replace(r"\{first\}", r"\d+").replace(r"\{last\}", r"\d+") for t in (FOCUS_MARK, GAP_MARK))
    at = 0
    for piece in re.split(marks, excerpt):
        i = original.find(piece, at)
        if i < 0:
            return False
        at = i + len(piece)
    return True


def test_excerpt_keeps_the_focus_line_with_its_context_and_names_the_id():
    counter = TokenCounter()
    m = Message("tool", big_file(), tool_call_id="call_X1")
    e = excerpt_for(m, 600, counter, {"separability_matrix", "not_in_the_result"})
    assert e.rendered_as == "excerpt"
    assert counter.count_message(e) <= 600
    assert "call_X1" in e.content
    lines = e.content.split("\n")
    i = lines.index(TARGET)  # the line by construction, with two lines of context each side
    assert lines[i - 2:i] == [FILLER.format(i=535), FILLER.format(i=536)]
    assert lines[i + 1:i + 3] == [FILLER.format(i=538), FILLER.format(i=539)]
    # the gap after the window names the 1-based lines it leaves out: 0-based 540 is line 541
    assert lines[i + 3] == GAP_MARK.strip("\n").format(first=541, last=lines[i + 3].split("–")[1].split(" ")[0])
    assert lines[0] == FILLER.format(i=0) and lines[-1] == FILLER.format(i=999)  # head and tail
    assert pieces_in_order(e.content, m.content)


def test_without_a_value_in_the_result_it_is_the_head_and_tail_excerpt():
    counter = TokenCounter()
    m = Message("tool", big_file(), tool_call_id="call_X2")
    plain = excerpt_for(m, 600, counter)
    assert excerpt_for(m, 600, counter, {"absent_value_1"}) == plain
    assert EXCERPT_MARK.split("{id}")[0] in plain.content and TARGET not in plain.content  # the line is in the middle


def test_focus_reads_the_last_assistant_messages_and_the_current_user_message():
    g = ContextGraph("g", [
        Message("user", "fix ISSUE-4411 please"),
        Message("assistant", "looking at old_module.py", (ToolCall("a", "bash", '{"command": "ls"}'),)),
        Message("tool", "x", tool_call_id="a"),
        Message("assistant", "", (ToolCall("b", "bash", '{"command": "grep -n fn_two src"}'),)),
        Message("tool", "y", tool_call_id="b"),
        Message("assistant", "then fn_three", (ToolCall("c", "bash", '{"command": "cat src/mod_c.py"}'),)),
        Message("tool", "z", tool_call_id="c"),
    ])
    assert focus_values(g, 0, 2) == {"ISSUE-4411", "fn_two", "fn_three", "mod_c.py"}
    assert focus_values(g, None, 3) == {"old_module.py", "fn_two", "fn_three", "mod_c.py"}
    assert focus_values(g, 0, 0) == frozenset()
    with pytest.raises(ValueError, match="messages"):
        focus_values(g, 0, -1)


def graph_with_large_newest_result():
    return ContextGraph("g", [
        Message("system", "You are a coding agent."),
        Message("user", "The separability_matrix of nested models is wrong; fix it."),
        Message("assistant", "Let me read the module.", (ToolCall("c1", "bash", '{"command": "cat modeling/separable.py"}'),)),
        Message("tool", big_file(), tool_call_id="c1"),
    ])


@pytest.mark.parametrize("name", ["learned", "contextrender", "prune"])
def test_the_newest_result_larger_than_b_is_shown_focused(name):
    signals = Signals()
    g = graph_with_large_newest_result()
    budget = 1500
    r = create(name).render(g, budget, signals)
    check_invariants(r, g, signals.counter)
    shown = r.messages[r.positions.index(3)]
    assert shown.rendered_as == "excerpt" and "c1" in shown.content
    assert TARGET in shown.content.split("\n")
    assert signals.counter.count_message(shown) <= budget - sum(
        signals.counter.count_message(m) for m, p in zip(r.messages, r.positions) if p not in (0, 1, 3))
    assert pieces_in_order(shown.content, g.messages[3].content)


def test_excerpt_focus_zero_keeps_head_and_tail():
    signals = Signals()
    g = graph_with_large_newest_result()
    r = create("contextrender", excerpt_focus=0).render(g, 1500, signals)
    check_invariants(r, g, signals.counter)
    shown = r.messages[r.positions.index(3)]
    assert shown.rendered_as == "excerpt" and TARGET not in shown.content
    with pytest.raises(ValueError, match="excerpt_focus"):
        Layout(g, signals.counter, 1500, excerpt_focus=-1)
    with pytest.raises(ValueError, match="excerpt_focus"):
        create("learned", excerpt_focus=-2)
