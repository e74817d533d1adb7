"""Cache-stable rendering (policies/cache_stable.py, issue 37): between re-selections the rendering
only appends, so the previous request is a byte-identical prefix of the next; every rendering
holds the invariants; a re-selection renders to the low mark. Tests of the re-selection and of
the copies at the tail turn the young generation off (``young=0``: every call that would pass B
re-selects); tests/test_generations.py tests minor collections."""

from __future__ import annotations

import json

import pytest

from historygraph import ContextGraph, Message, Signals, ToolCall, check_invariants, create
from historygraph.policies.cache_stable import CacheStable, CacheStableConfig
from historygraph.traces import read_traces

from doubles import RankedPrune


def _wire(r) -> str:
    return json.dumps(r.to_openai(), ensure_ascii=False)


def _steps(n: int, size: int, head: str = "def f{i}(x):") -> list[Message]:
    msgs = [Message("system", "You are a shell agent."), Message("user", "Find the bug.")]
    for i in range(n):
        msgs.append(Message("assistant", f"step {i}", (ToolCall(f"c{i}", "bash", f'{{"cmd": "cat f{i}.py"}}'),)))
        msgs.append(Message("tool", head.format(i=i) + "\n" + "    return x + 1\n" * size, tool_call_id=f"c{i}"))
    return msgs


def test_appends_between_reselections_and_reselects_to_the_low_mark():
    """Twelve steps of ~110-token results at B = 1000: the first renders fit and come back
    unchanged; once the history passes B, prune re-selects to 600 tokens; the calls after that
    only append (each request a byte-identical prefix of the next) until B is reached again."""
    sig = Signals()
    policy = create("prune-stable", low_mark=0.6, young=0.0)
    msgs = _steps(12, 30)
    g = ContextGraph("s")
    kinds, prev = [], None
    g.extend(msgs[:2])
    for i in range(12):
        g.extend(msgs[2 + 2 * i: 4 + 2 * i])
        r = policy.render(g, 1000, sig)
        check_invariants(r, g, sig.counter)
        assert r.history_tokens <= 1000
        kinds.append(r.stats["cache_stable"])
        if r.stats["cache_stable"] == "appended":
            assert _wire(r).startswith(_wire(prev)[:-1])  # the previous list, with its closing bracket open
            assert r.messages[:len(prev.messages)] == prev.messages
            step = sum(sig.counter.count_message(m) for m in msgs[2 + 2 * i: 4 + 2 * i])
            assert r.history_tokens == prev.history_tokens + step  # exactly the new step, nothing rewritten
        else:
            assert not r.omitted or r.history_tokens <= 600  # a re-selection that left something out is at the low mark
        prev = r
    # every step costs the same (234 tokens): from the low mark (600) one append fits under B = 1000,
    # from the start three do; so re-selections are a third of the calls at most
    assert kinds[:4] == ["reselected", "appended", "appended", "appended"] and kinds[4] == "reselected"
    assert kinds.count("appended") >= 2 * kinds.count("reselected")


def test_a_message_between_a_call_and_its_result_reselects():
    sig = Signals()
    policy = CacheStable("prune-stable", CacheStableConfig(low_mark=0.6), base=create("prune"))
    msgs = _steps(3, 5)
    g = ContextGraph("s", msgs)
    policy.render(g, 5000, sig)
    g.append(Message("assistant", "", (ToolCall("late", "bash", "{}"),)))
    g.append(Message("user", "note while it runs"))
    g.append(Message("tool", "done", tool_call_id="late"))
    r = policy.render(g, 5000, sig)
    assert r.stats["cache_stable"] == "reselected"
    check_invariants(r, g, sig.counter)


def test_low_mark_is_checked():
    with pytest.raises(ValueError, match="low_mark must be in"):
        CacheStableConfig(low_mark=0.0)


def test_byte_identical_prefix_between_reselections_on_a_real_trace(traces_dir):
    """learned-stable on a real mini-swe-agent trajectory at B = 6000: every rendering holds the
    invariants, and every appended request starts with the previous request, byte for byte."""
    path = sorted((traces_dir / "mini-swe-agent-deepseek").glob("*"))[0]
    trace = next(iter(read_traces(path)))
    sig = Signals()
    policy = create("learned-stable")
    g = ContextGraph(trace.trace_id)
    prev = None
    appended = reselected = 0
    for m in trace.messages:
        if m.role == "assistant" and len(g):
            r = policy.render(g, 6000, sig)
            check_invariants(r, g, sig.counter)
            if r.stats.get("cache_stable") == "appended":
                appended += 1
                assert _wire(r).startswith(_wire(prev)[:-1])
            elif r.stats.get("cache_stable") == "reselected":
                reselected += 1
            prev = r
        g.append(m)
    assert appended > reselected > 0


def _valued_steps(n: int, size: int) -> list[Message]:
    """Like :func:`_steps`, each result holding one TFA value of its own (``VAL_{i}_x``, ContextRender A.2)."""
    return _steps(n, size, head="VAL_{i}_x")


def _grow_until_omitted(policy, g: ContextGraph, msgs: list[Message], budget: int, sig: Signals) -> tuple[int, object]:
    """Append steps of ``msgs`` and render after each until the first result (position 3) is left out."""
    g.extend(msgs[:2])
    for i in range(0, len(msgs) - 2, 2):
        g.extend(msgs[2 + i: 4 + i])
        r = policy.render(g, budget, sig)
        if 3 in r.omitted:
            return i // 2, r
    raise AssertionError("the first result was never left out")


def test_a_result_the_latest_call_used_is_appended_again_in_full():
    """Once prune-stable has left the first result out, a tool call that uses its value
    (``VAL_0_x``, TFA's attribution) gets a complete copy of it appended after the new result: the
    previous request stays a byte-identical prefix, the copy names the result's id, B holds, and
    the result counts as shown complete."""
    sig = Signals()
    policy = create("prune-stable", low_mark=0.6, young=0.0)
    g = ContextGraph("s")
    _, prev = _grow_until_omitted(policy, g, _valued_steps(12, 30), 1000, sig)
    g.extend([Message("assistant", "look again", (ToolCall("u1", "bash", '{"cmd": "grep VAL_0_x f0.py"}'),)),
              Message("tool", "VAL_0_x", tool_call_id="u1")])
    r = policy.render(g, 1000, sig)
    check_invariants(r, g, sig.counter)
    assert r.stats["cache_stable"] == "appended"
    assert r.messages[:len(prev.messages)] == prev.messages
    copy = r.messages[-1]
    assert copy.role == "user" and copy.rendered_as == "recalled" and r.positions[-1] is None
    assert "tool result c0" in copy.content and copy.content.endswith(g.messages[3].content)
    assert 3 in r.full and r.history_tokens <= 1000
    # the next call appends after the copy, which stays where it is
    g.extend([Message("assistant", "next", (ToolCall("u2", "bash", '{"cmd": "ls"}'),)), Message("tool", "a.py", tool_call_id="u2")])
    r2 = policy.render(g, 1000, sig)
    check_invariants(r2, g, sig.counter)
    assert r2.stats["cache_stable"] == "appended" and r2.messages[:len(r.messages)] == r.messages


def test_no_copy_when_it_would_pass_the_budget_or_is_switched_off():
    """At the low mark 0.9 the new step still fits under B = 1000 but its copy would
    not (816 + ~230 tokens): the call only appends; with ``recall_tail`` off no copy is made either."""
    sig = Signals()
    for low, tail in ((0.9, True), (0.6, False)):
        policy = create("prune-stable", low_mark=low, recall_tail=tail)
        g = ContextGraph("s")
        _, prev = _grow_until_omitted(policy, g, _valued_steps(12, 30), 1000, sig)
        g.extend([Message("assistant", "look again", (ToolCall("u1", "bash", '{"cmd": "grep VAL_0_x f0.py"}'),)),
                  Message("tool", "VAL_0_x", tool_call_id="u1")])
        r = policy.render(g, 1000, sig)
        check_invariants(r, g, sig.counter)
        assert r.stats["cache_stable"] == "appended", (low, prev.history_tokens)
        assert all(m.rendered_as != "recalled" for m in r.messages) and 3 not in r.full


def test_the_recalled_copy_is_a_valid_request_in_each_api():
    """The copy is a user message (position None) after the tool results: Chat Completions and
    Responses accept a user message after tool results, Anthropic merges it, its own user turn,
    with the results' turn; the fake provider, which enforces each API's documented rules, accepts
    all three conversions."""
    from fake_responses import responses_violation
    from fake_upstream import anthropic_violation, openai_violation

    from historygraph.providers import anthropic, openai_responses

    sig = Signals()
    policy = create("prune-stable", low_mark=0.6, young=0.0)
    g = ContextGraph("s")
    _grow_until_omitted(policy, g, _valued_steps(12, 30), 1000, sig)
    g.extend([Message("assistant", "look again", (ToolCall("u1", "bash", '{"cmd": "grep VAL_0_x f0.py"}'),)),
              Message("tool", "VAL_0_x", tool_call_id="u1")])
    r = policy.render(g, 1000, sig)
    assert r.messages[-1].rendered_as == "recalled" and r.messages[-2].role == "tool"
    chat = r.to_openai()
    assert chat[-1]["role"] == "user" and openai_violation(chat) is None
    body = {"model": "m", "max_tokens": 10, "system": "You are a shell agent.",
            "messages": anthropic.from_canonical(r.messages, [None] * len(r.messages))}
    assert body["messages"][-2]["content"][0]["type"] == "tool_result" and body["messages"][-1]["role"] == "user"
    assert anthropic_violation(body) is None
    items = openai_responses.from_canonical(r.messages, [None] * len(r.messages))
    assert items[-2]["type"] == "function_call_output" and items[-1]["role"] == "user"
    assert responses_violation({"model": "m", "input": items}) is None


def test_a_reselection_never_cuts_a_newest_result_that_b_shows_complete():
    """Four steps of 234 tokens, then a newest result of 707 tokens, at B = 1000 with the low mark
    0.6: 600 tokens cannot hold it beside the protected history (prune at 600 shows it as an
    excerpt) but B can, so the re-selection renders at B and shows it complete (§5.9), as prune does."""
    sig = Signals()
    msgs = _steps(4, 30)
    msgs.append(Message("assistant", "step big", (ToolCall("big", "bash", '{"cmd": "cat big.py"}'),)))
    msgs.append(Message("tool", "def big(x):\n" + "    return x + 1\n" * 100, tool_call_id="big"))
    g = ContextGraph("s", msgs)
    assert sig.counter.count_message(msgs[-1]) == 707
    assert create("prune").render(g, 600, sig).messages[-1].rendered_as == "excerpt"
    r = create("prune-stable", low_mark=0.6).render(g, 1000, sig)
    check_invariants(r, g, sig.counter)
    assert r.stats["cache_stable"] == "reselected" and len(msgs) - 1 in r.full and r.messages[-1] is msgs[-1]
    assert r.history_tokens == create("prune").render(g, 1000, sig).history_tokens


def test_results_the_wrapped_policy_finds_likely_are_appended_most_probable_first():
    """After a re-selection left the first results out, the next call appends a complete copy of
    each result with reuse probability >= predicted_tail (0.1), most probable first, while B holds:
    position 5 (0.4) fits, 3 (0.15) would pass B = 1000, 7 (0.05) is below the threshold."""
    sig = Signals()
    policy = CacheStable("p", CacheStableConfig(low_mark=0.6, recall_tail=False, predicted_tail=0.1, young=0.0),
                         base=RankedPrune({3: 0.15, 5: 0.4, 7: 0.05}))
    g = ContextGraph("s")
    _, prev = _grow_until_omitted(policy, g, _steps(12, 30), 1000, sig)
    assert {3, 5, 7} <= set(prev.omitted) and prev.stats["cache_stable"] == "reselected"
    g.extend([Message("assistant", "next", (ToolCall("u1", "bash", '{"cmd": "ls"}'),)), Message("tool", "a.py", tool_call_id="u1")])
    r = policy.render(g, 1000, sig)
    check_invariants(r, g, sig.counter)
    assert r.stats["cache_stable"] == "appended" and r.messages[:len(prev.messages)] == prev.messages
    copies = [m for m in r.messages[len(prev.messages):] if m.rendered_as == "recalled"]
    assert len(copies) == 1 and "tool result c1" in copies[0].content and copies[0].content.endswith(g.messages[5].content)
    assert 5 in r.full and 3 not in r.full and 7 not in r.full and r.history_tokens <= 1000
    assert r.reasons[5].startswith("shown again at the end: reuse probability 0.400")
    # the same run with the threshold at 0 (off): no copy
    off = CacheStable("p", CacheStableConfig(low_mark=0.6, recall_tail=False, predicted_tail=0.0, young=0.0), base=RankedPrune({5: 0.4}))
    g2 = ContextGraph("s")
    _grow_until_omitted(off, g2, _steps(12, 30), 1000, sig)
    g2.extend(g.messages[len(g2):])
    assert all(m.rendered_as != "recalled" for m in off.render(g2, 1000, sig).messages)


def test_predicted_tail_is_checked():
    with pytest.raises(ValueError, match="predicted_tail must be in"):
        CacheStableConfig(predicted_tail=1.5)


def test_a_budget_that_moves_by_a_few_tokens_keeps_appending():
    """The proxy's calibration moves B by a few tokens at every call: the rendering keeps appending
    (each request a prefix of the next) as it does at a fixed B; a move of more than a tenth re-selects."""
    sig = Signals()
    msgs = _steps(12, 30)
    kinds = {}
    for name, budgets in (("fixed", [1000] * 12), ("jitter", [1000, 1004, 996, 1003, 998, 1001, 997, 1005, 999, 1002, 995, 1000])):
        policy = create("prune-stable", low_mark=0.6)
        g = ContextGraph("s")
        g.extend(msgs[:2])
        kinds[name] = []
        for i in range(12):
            g.extend(msgs[2 + 2 * i: 4 + 2 * i])
            r = policy.render(g, budgets[i], sig)
            check_invariants(r, g, sig.counter)
            assert r.history_tokens <= budgets[i]
            kinds[name].append(r.stats["cache_stable"])
    # (before, the wrapper's state was keyed by B: every move re-selected, 12 of 12 calls)
    assert kinds["jitter"].count("reselected") <= kinds["fixed"].count("reselected") <= 4
    policy = create("prune-stable", low_mark=0.6)
    g = ContextGraph("s")
    g.extend(msgs[:4])
    policy.render(g, 1000, sig)
    g.extend(msgs[4:6])
    assert policy.render(g, 1000, sig).stats["cache_stable"] == "appended"
    g.extend(msgs[6:8])
    assert policy.render(g, 1500, sig).stats["cache_stable"] == "reselected"  # B raised by half: re-select at it


def test_the_timeline_counts_a_copy_at_the_tail_as_shown_complete(traces_dir):
    """Issue 48, item 7: a result shown again at the end has no position of its own, so the replay's
    timeline kept its placeholder and undercounted the cache-stable policies against the recall of
    the same replay (on django-11099 at B = 3000, prune-stable's timeline had 6 of the 8 hits).
    Every reuse event the replay scores as a hit is an ``F`` in the timeline, and no other."""
    from historygraph.eval.replay import replay_trace

    trace = next(iter(read_traces(traces_dir / "mini-swe-agent-deepseek" / "django__django-11099.traj.json")))
    names, sig = ("prune-stable", "learned-stable"), Signals()
    res = replay_trace(trace, {n: create(n) for n in names}, 3000, sig)
    t = res.timeline
    for n in names:
        assert sum(t.forms[n][call][k] == "F" for call, k in t.events) == res.stats[n].hits, n
    policy, g, copies = create("prune-stable"), ContextGraph("again"), 0  # the case arises: copies at the tail
    for m in trace.messages:
        if m.role == "assistant" and len(g):
            copies += sum(x.rendered_as == "recalled" for x in policy.render(g, 3000, sig).messages)
        g.append(m)
    assert copies > 0


def test_an_inspection_leaves_the_state_the_last_model_call_left(tmp_path):
    """A look at a session's rendering (the session API's render, ``historygraph render``) at another
    budget neither writes the state kept in the store nor changes this process's: the next model
    call extends the rendering the previous call was sent (before, an inspection at B = 600
    became the state, and the next call re-selected: the budget had moved by 40 %)."""
    from historygraph import SQLiteStore, Session
    from historygraph.policies.cache_stable import inspect

    store = SQLiteStore(tmp_path / "s.sqlite")
    s = Session("s", store=store, policy="prune", budget=1000)
    msgs = _steps(12, 30)
    for m in msgs[:9]:
        s.add(m)
    s.render()
    kept = store.policy_state("s", "cache-stable:prune-stable")
    assert kept is not None and json.loads(kept)["length"] == 9
    looked = inspect(s._policies["prune"], store.graph("s"), 600, s.signals)
    assert looked.budget == 600 and store.policy_state("s", "cache-stable:prune-stable") == kept
    for m in msgs[9:11]:
        s.add(m)
    before = s.rendering.messages
    s.render()
    assert s.rendering.stats["cache_stable"] == "appended" and s.rendering.messages[:len(before)] == before
    store.close()
