"""ReCAP §5 Codex-style summarization baseline (`codex-summary`): user instructions verbatim and in
order, the handoff summary after them, the budget, model usage, caching and merging."""

import pytest

from doubles import CountingModel, ScriptedModel
from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.policies.baselines.handoff import HANDOFF_INSTRUCTIONS
from historygraph.render import Layout, check_invariants
from historygraph.store import MemoryStore


def call(cid, cmd):
    return ToolCall(cid, "bash", f'{{"command": "{cmd}"}}')


def three_instructions():
    """Three user instructions; 7 is the current one (outside B); 10 is a call in flight."""
    return [Message("system", "You are a coding agent."),
            Message("user", "Fix the failing test in parser.py."),
            Message("assistant", "look", (call("c0", "cat parser.py"),)),
            Message("tool", "def parse(text):\n" + "    token = next(stream)\n" * 40, tool_call_id="c0"),
            Message("user", "Do not change the public API."),
            Message("assistant", "run the tests", (call("c1", "pytest"),)),
            Message("tool", "FAILED tests/test_parser.py::test_parse - KeyError: 'eof'\n" * 30, tool_call_id="c1"),
            Message("user", "Also add a changelog entry."),
            Message("assistant", "edit", (call("c2", "sed -i s/a/b/ parser.py"),)),
            Message("tool", "edited line 12\n" * 40, tool_call_id="c2"),
            Message("assistant", "", (call("c3", "pytest"),))]


def signals_with(model, store=None):
    return Signals(model_factory=lambda: model, store=store)


def test_user_instructions_stay_verbatim_and_in_order_before_the_summary():
    model = CountingModel()
    sig = signals_with(model)
    msgs = three_instructions()
    g = ContextGraph("g", msgs)
    budget = Layout(g, sig.counter, None).full_history_tokens - 1  # one token over B
    r = create("codex-summary").render(g, budget, sig)
    check_invariants(r, g, sig.counter)
    # system, the three user messages unchanged and in order, then the summary, then the call in flight
    assert r.positions == [0, 1, 4, 7, None, 10]
    assert [r.messages[i] for i in (1, 2, 3)] == [msgs[1], msgs[4], msgs[7]]
    s = r.messages[4]
    assert s.role == "user" and s.rendered_as == "summary" and s.content.endswith("summary #1")
    assert s.content.startswith("[handoff summary of the earlier work: stands for messages 2-9 except the user "
                                "messages, which are shown verbatim (3 tool results, ids c0 .. c2)")
    assert r.full == [] and r.history_tokens <= budget
    # one call, charged as the test model reports it: 2 messages x 10 tokens in, 5 out, 0.25 s
    assert r.stats == {"model_calls": 1, "model_input_tokens": 20, "model_output_tokens": 5, "model_seconds": 0.25}
    [prompt] = model.prompts
    assert prompt[0]["content"] == HANDOFF_INSTRUCTIONS
    text = prompt[1]["content"]
    assert text.startswith("User instructions:\n[user] Fix the failing test in parser.py.\n"
                           "[user] Do not change the public API.\n[user] Also add a changelog entry.\n\nWork so far:\n")
    work = text.split("Work so far:\n", 1)[1]
    assert "[user]" not in work  # the instructions are not condensed
    assert [line.split("]")[0] + "]" for line in work.splitlines() if line.startswith("[")] == \
        ["[assistant]", "[tool result c0]", "[assistant]", "[tool result c1]", "[assistant]", "[tool result c2]"]


def test_a_later_summary_folds_in_the_previous_one_and_keeps_every_instruction():
    model = CountingModel()
    sig = signals_with(model)
    policy = create("codex-summary")
    msgs = [Message("system", "s"), Message("user", "task: make the build green")]
    for i in range(24):
        msgs.append(Message("assistant", f"step {i}", (call(f"c{i}", f"cat f{i}"),)))
        msgs.append(Message("tool", f"listing {i}\n" + "src/pkg/module.py line\n" * 30, tool_call_id=f"c{i}"))
        if i % 8 == 3:
            msgs.append(Message("user", f"instruction {i}: keep f{i} unchanged"))
    budget = 1500
    for k in range(3, len(msgs) + 1):  # replay: render before every assistant message and at the end
        if k == len(msgs) or msgs[k].role == "assistant":
            g = ContextGraph("g", msgs[:k])
            r = policy.render(g, budget, sig)
            check_invariants(r, g, sig.counter)
            assert r.history_tokens <= budget
            users = [m for m in r.messages if m.role == "user" and m.rendered_as is None]
            assert users == [m for m in msgs[:k] if m.role == "user"]  # all of them, verbatim, in order
    assert len(model.prompts) >= 2
    second = model.prompts[1][1]["content"]
    assert "Previous handoff summary:\nsummary #1\n\nWork since that summary:\n" in second
    [s] = [m for m in r.messages if m.rendered_as == "summary"]
    assert s.content.endswith(f"summary #{len(model.prompts)}")


def test_second_render_comes_from_the_store_cache():
    store = MemoryStore()
    model = CountingModel()
    g = ContextGraph("g", three_instructions())
    budget = Layout(g, Signals().counter, None).full_history_tokens - 1
    first = create("codex-summary").render(g, budget, signals_with(model, store))
    again = create("codex-summary").render(g, budget, signals_with(model, store))  # fresh policy, same store
    assert len(model.prompts) == 1 and first.stats["model_calls"] == 1 and again.stats["model_calls"] == 0
    assert again.messages == first.messages


def test_a_long_summary_is_cut_to_the_room_the_instructions_leave():
    answer = " ".join(f"fact{i}" for i in range(3000))
    sig = signals_with(ScriptedModel([answer]))
    msgs = three_instructions()
    g = ContextGraph("g", msgs)
    budget = 600
    r = create("codex-summary").render(g, budget, sig)
    check_invariants(r, g, sig.counter)
    assert r.history_tokens <= budget
    [s] = [m for m in r.messages if m.rendered_as == "summary"]
    body = s.content.split("]\n", 1)[1]
    assert body and answer.startswith(body) and len(body) < len(answer)
    assert [m for m in r.messages if m.role == "user" and m.rendered_as is None] == [msgs[1], msgs[4], msgs[7]]


def test_under_budget_history_is_unchanged_without_a_model_call():
    model = CountingModel()
    g = ContextGraph("g", three_instructions())
    r = create("codex-summary").render(g, 10**6, signals_with(model))
    assert r.messages == g.messages and model.prompts == [] and r.stats["model_calls"] == 0


@pytest.mark.parametrize("value", [{"max_summary_tokens": 0}, {"prompt_chars": 10}])
def test_bad_config_is_refused_by_name(value):
    from historygraph.policies import PolicyError

    with pytest.raises(PolicyError, match="codex-summary"):
        create("codex-summary", **value)


def test_a_real_mini_swe_agent_trace_replays_within_b_with_every_invariant(traces_dir):
    from historygraph.eval.replay import replay_trace
    from historygraph.traces import read_traces

    trace = next(iter(read_traces(traces_dir / "mini-swe-agent-deepseek/sqlfluff__sqlfluff-2419.traj.json")))
    model = ScriptedModel()
    res = replay_trace(trace, {"codex-summary": create("codex-summary")}, 6000, signals_with(model))
    st = res.stats["codex-summary"]
    assert st.violations == [] and max(st.history_tokens) <= 6000
    assert st.model_calls == len(model.calls) > 0  # the history outgrows B: summaries were written and charged
    assert all(call[1]["content"].startswith("User instructions:\n[user] ") for call in model.calls)


def test_instructions_are_clipped_to_their_heads():
    from historygraph.policies.baselines.handoff import instructions_text

    one = instructions_text([Message("user", "a" * 1000)], 600)  # share 600 - 10: 7 + 590 + 2 = 599 characters
    assert one == "[user] " + "a" * 590 + " …"
    many = instructions_text([Message("user", f"{i} " + "b" * 100) for i in range(30)], 600)
    # share max(40, 600 // 30 - 10 = 10) = 40 characters each; 30 lines of 7 + 40 + 2 = 49 characters and 29
    # newlines = 1499 > 600: the first 300 and the last 300 characters remain
    assert len(many) == 603 and many.startswith("[user] 0 bbb") and many.endswith("bb …")
