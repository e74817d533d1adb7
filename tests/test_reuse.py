"""Tool-Flow Analysis (ContextRender §3.2, A.2). Expected values worked out by hand from the rules."""

import math

import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.history.reuse import extract_values


def test_contact_example_of_a2():
    # A.2 "Relation to the motivating example": names do not qualify (Kathryn is Titlecase, Troy and
    # Nancy are shorter than six); e-mails split at @; kathrynmaldonado fails the character filter,
    # tr_solo, nan_ritt and gmail.com qualify.
    text = ('[{"name": "Kathryn", "email": "kathrynmaldonado@gmail.com"}, {"name": "Troy", "email": "tr_solo@gmail.com"},'
            ' {"name": "Nancy", "email": "nan_ritt@gmail.com"}]')
    assert extract_values(text) == {"tr_solo", "nan_ritt", "gmail.com"}


@pytest.mark.parametrize("text,expected", [
    ("Kathryn Maldonado", set()),                # pure-alphabetic Titlecase excluded
    ("McDonald README", {"McDonald", "README"}),  # uppercase but not Titlecase: kept
    ("abcdefgh", set()),                         # lowercase letters only: no qualifying character
    ("/usr/lib/python3.11/site-packages/foo_bar.py", {"python3.11", "site-packages", "foo_bar.py"}),
    ("see value_x.", {"value_x"}),               # trailing period stripped
    ("__init__", set()),                         # 'init' after stripping: shorter than six
    ("-abc_de-", {"abc_de"}),                    # leading/trailing hyphen stripped, inner underscore kept
    ("a.b-c_d", {"a.b-c_d"}),                    # inner separators-that-are-not-separators kept
    ("x=ab1234,'cd5678'", {"ab1234", "cd5678"}),  # comma, quote, '=' separate
    ("ab123", set()),                            # matches the pattern (5 chars) but is shorter than six
])
def test_extraction_rules(text, expected):
    assert extract_values(text) == expected


def _call(cid, args):
    return ToolCall(cid, "tool", args)


def _graph(*msgs):
    return ContextGraph("t", list(msgs))


def test_case_sensitive_whole_token_matching():
    g = _graph(
        Message("user", "go"),
        Message("assistant", "", (_call("c1", "{}"),)),
        Message("tool", "id=ABC_123", tool_call_id="c1"),
        Message("assistant", "abc_123 and ABC_1234 and XABC_123"),  # wrong case, longer tokens: no match
    )
    assert g.reuse_score(2) == 0.0
    g.append(Message("assistant", "use (ABC_123)."))
    assert g.reuse_score(2) == 1.0


def test_value_counts_once_per_operation_and_per_separate_operation():
    g = _graph(
        Message("user", "go"),
        Message("assistant", "", (_call("c1", "{}"),)),
        Message("tool", "ORD-7781 and ORD-7781 again", tool_call_id="c1"),
        # one operation (the text) repeats the value twice -> 1; two tool calls each use it -> 2 more
        Message("assistant", "ORD-7781 ORD-7781", (_call("c2", '{"o": "ORD-7781"}'), _call("c3", '{"o": "ORD-7781"}'))),
    )
    assert g.reuse_score(2) == 3.0
    assert len(g.reuse_matches(2)) == 3


def test_first_result_attribution_and_one_over_n_weighting():
    g = _graph(
        Message("user", "go"),
        Message("assistant", "", (_call("c1", "{}"), _call("c2", "{}"))),
        Message("tool", "token tok_aa11", tool_call_id="c1"),
        Message("tool", "copy tok_aa11 and tok_bb22", tool_call_id="c2"),
        Message("assistant", "", (_call("c3", '{"t": "tok_aa11", "u": "tok_bb22"}'),)),
    )
    # tok_aa11: first holder is position 2, held by 2 results -> 1/2; tok_bb22: position 3, n = 1 -> 1
    assert g.reuse_score(2) == pytest.approx(0.5)
    assert g.reuse_score(3) == pytest.approx(1.0)
    # n_t grows when a later result repeats the value: the same match is now worth 1/3
    g.append(Message("assistant", "", (_call("c4", "{}"),)))
    g.append(Message("tool", "tok_aa11 once more", tool_call_id="c4"))
    assert g.reuse_score(2) == pytest.approx(1 / 3)
    assert [e.label for e in g.edges()] == ["tok_aa11", "tok_bb22"]


def test_user_messages_are_not_operations():
    g = _graph(
        Message("user", "go"),
        Message("assistant", "", (_call("c1", "{}"),)),
        Message("tool", "key KEY_000111", tool_call_id="c1"),
        Message("user", "please use KEY_000111"),
    )
    assert g.reuse_score(2) == 0.0
    assert not math.isnan(g.reuse_score(2))


def test_latest_operations_hold_the_values_of_the_joined_text_on_real_traces(traces_dir):
    """The learned features read the latest assistant message's values as TFA took them per
    operation (graph.latest_operations); their union must be the extraction of the operations
    joined by newlines (a candidate never spans the newline), on every assistant message."""
    from historygraph.traces import read_traces
    from historygraph.history.graph import operations

    checked = with_calls = 0
    for tr in list(read_traces(traces_dir / "mini-swe-agent-deepseek"))[:4] + list(read_traces(traces_dir / "openhands"))[:2]:
        g = ContextGraph(tr.trace_id)
        for m in tr.messages:
            p = g.append(m)
            if m.role != "assistant":
                continue
            assert g.latest_operations is not None and g.latest_operations[0] == p
            union = frozenset().union(*g.latest_operations[1])
            assert union == extract_values("\n".join(operations(m))), (tr.trace_id, p)
            checked += 1
            with_calls += bool(m.tool_calls) and bool(union)
    assert checked > 100 and with_calls > 50
    # a value on either side of the newline stays whole, and the newline never joins two
    g = ContextGraph("t", [Message("assistant", "see abc_def", (ToolCall("c", "bash", '{"x": "ghi_jkl"}'),))])
    assert frozenset().union(*g.latest_operations[1]) == {"abc_def", "ghi_jkl"} == extract_values("see abc_def\nbash {\"x\": \"ghi_jkl\"}")
