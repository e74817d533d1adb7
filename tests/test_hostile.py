"""Hostile histories (issue 6, inputs 1–9), each run against every registered policy.

Expected behaviour per input class:
1. a call with no result, followed by a user message → answered by a synthetic error result;
2. a cut that would start the rendering with a result whose call fell before it → the result is
   dropped with its call or kept with it (pairing never broken);
3. 500 call/result pairs, a budget cutting between a call and its result, then one more call in
   flight → valid rendering within B, in-flight call last;
4. ``[user, assistant(c1), tool(c1, large), assistant, user]`` → valid, within B;
5. ``[system, user, assistant(call), tool]`` under B → unchanged;
6. 7 parallel calls cut inside the batch → the batch stays atomic;
7. the last message is an in-flight call → always kept;
8. budget below the protected history → :class:`BudgetTooSmallError` with the shortfall;
9. one result of 700,000 / 2,000,000 characters → a marked excerpt naming its id, original kept
   (block-atomic ReCAP instead drops the block with its call; the pairing stays valid).
"""

import re
import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create, names
from historygraph.render import BudgetTooSmallError, check_invariants

from doubles import ScriptedModel, TableScorer

POLICIES = names()
BUDGETED = [p for p in POLICIES if p != "full"]
ATTENTION = {"recap", "recap-line", "recap-paragraph"}  # run the SmolLM2 proxy attention


def lm_marked(names_: list[str]) -> list:
    """``names_`` with the ``lm`` mark on the policies that run the local language model."""
    return [pytest.param(n, marks=pytest.mark.lm) if n in ATTENTION else n for n in names_]

# Policies that by design rewrite or cut the history as a whole when it exceeds B: the summarising
# baselines fold older results into a summary, ReCAP Recency stops at the first block that does not fit.
WHOLE_HISTORY = {"compact-llm", "codex-summary", "recency-summary", "recap-recency"}


@pytest.fixture(scope="module")
def signals():
    return Signals(model_factory=ScriptedModel, scorer_factory=TableScorer)  # summarising policies get a deterministic model


def call(cid, args='{"command": "cat file.txt"}'):
    return ToolCall(cid, "bash", args)


def render(name, msgs, budget, signals):
    g = ContextGraph("h", msgs)
    r = create(name).render(g, budget, signals)
    check_invariants(r, g, signals.counter)
    return g, r


@pytest.mark.parametrize("name", POLICIES)
def test_1_call_without_result_then_user(name, signals):
    msgs = [Message("user", "task"), Message("assistant", "", (call("c1"),)), Message("user", "why no answer?")]
    _, r = render(name, msgs, 6000, signals)
    synth = [m for m in r.messages if m.role == "tool"]
    assert len(synth) == 1 and synth[0].tool_call_id == "c1" and "no result" in synth[0].content


@pytest.mark.parametrize("name", BUDGETED)
def test_2_cut_never_starts_with_an_orphaned_result(name, signals):
    msgs = [Message("user", "task")]
    for i in range(6):
        msgs += [Message("assistant", f"step {i}", (call(f"c{i}"),)), Message("tool", f"out {i} " + "w " * 400, tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "done"))
    _, r = render(name, msgs, 700, signals)
    first_history = next(m for m in r.messages if m.role != "system")
    assert first_history.role != "tool"


@pytest.mark.parametrize("name", BUDGETED)
def test_3_five_hundred_pairs_and_one_in_flight(name, signals):
    msgs = [Message("user", "task")]
    for i in range(500):
        msgs += [Message("assistant", "", (call(f"c{i}", f'{{"n": {i}}}'),)), Message("tool", f"value {i}", tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "", (call("last"),)))
    g, r = render(name, msgs, 3001, signals)
    assert r.history_tokens <= 3001
    assert r.messages[-1] is msgs[-1]


@pytest.mark.parametrize("name", lm_marked(POLICIES))
def test_4_large_result_with_budget_for_the_last_three(name, signals):
    c = signals.counter
    msgs = [Message("user", "task"), Message("assistant", "", (call("c1"),)), Message("tool", "big " * 3000, tool_call_id="c1"),
            Message("assistant", "summary of it"), Message("user", "next question")]
    budget = sum(c.count_message(m) for m in msgs[2:])
    g, r = render(name, msgs, budget, signals)
    tools = [m for m in r.messages if m.role == "tool"]
    assert all(m.tool_call_id == "c1" for m in tools)


@pytest.mark.parametrize("name", POLICIES)
def test_5_small_history_unchanged(name, signals):
    msgs = [Message("system", "sys"), Message("user", "task"), Message("assistant", "", (call("c1"),)),
            Message("tool", "ok", tool_call_id="c1")]
    _, r = render(name, msgs, 6000, signals)
    assert r.messages == msgs


@pytest.mark.parametrize("name", BUDGETED)
def test_6_parallel_batch_is_atomic(name, signals):
    msgs = [Message("user", "task"), Message("assistant", "seven", tuple(call(f"p{i}") for i in range(7)))]
    msgs += [Message("tool", f"r{i} " + "x " * 200, tool_call_id=f"p{i}") for i in range(7)]
    msgs.append(Message("assistant", "thinking"))
    _, r = render(name, msgs, 900, signals)
    idx = next((i for i, m in enumerate(r.messages) if m.tool_calls), None)
    if idx is None:  # block-atomic policies (ReCAP) may drop the whole batch with its call
        assert not any(m.role == "tool" for m in r.messages)
    else:
        assert [m.tool_call_id for m in r.messages[idx + 1: idx + 8]] == [f"p{i}" for i in range(7)]


@pytest.mark.parametrize("name", POLICIES)
def test_7_in_flight_call_is_kept(name, signals):
    msgs = [Message("user", "task")]
    for i in range(20):
        msgs += [Message("assistant", "", (call(f"c{i}"),)), Message("tool", "data " * 100, tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "now", (call("x1"), call("x2"))))
    _, r = render(name, msgs, 1500, signals)
    assert r.messages[-1] is msgs[-1]


@pytest.mark.parametrize("name", lm_marked(BUDGETED))
def test_8_budget_below_protected_part(name, signals):
    msgs = [Message("user", "a long first task " * 100), Message("assistant", "", (call("c1"),)),
            Message("tool", "ok", tool_call_id="c1"), Message("user", "follow-up")]
    policy = create(name)
    g = ContextGraph("h", msgs)
    errors = []
    for _ in range(2):  # asking again fails the same way, promptly, without returning anything
        with pytest.raises(BudgetTooSmallError) as info:
            policy.render(g, 100, signals)
        errors.append(info.value)
    assert errors[0].shortfall == errors[1].shortfall == errors[0].required - 100 > 0
    assert "short" in str(errors[0])


@pytest.mark.parametrize("size", [700_000, 2_000_000])
@pytest.mark.parametrize("name", BUDGETED)
def test_9_result_larger_than_the_budget(name, size, signals):
    big = ("2024-01-01 12:00:00 INFO worker processed item id=ABC_123 status=ok\n" * (size // 64 + 1))[:size]
    msgs = [Message("user", "task"), Message("assistant", "", (call("c1"),)), Message("tool", "small ok", tool_call_id="c1"),
            Message("assistant", "", (call("huge"),)), Message("tool", big, tool_call_id="huge"), Message("assistant", "next")]
    g, r = render(name, msgs, 6000, signals)
    shown = next((m for m in r.messages if m.tool_call_id == "huge"), None)
    if shown is None:  # block-atomic policies (ReCAP) drop the oversized block together with its call
        assert not any(c.id == "huge" for m in r.messages for c in m.tool_calls)
    else:
        assert shown.rendered_as in ("excerpt", "placeholder", "summary", "compressed") and "huge" in shown.content
    assert g.result_by_id("huge").content == big and len(big) == size
    if name not in WHOLE_HISTORY:
        assert any(m.tool_call_id == "c1" for m in r.messages)  # the rest is unaffected


def test_9_contextrender_shows_the_excerpt(signals):
    big = "x=1 y=2 line\n" * 160_000
    msgs = [Message("user", "task"), Message("assistant", "", (call("huge"),)), Message("tool", big, tool_call_id="huge"),
            Message("assistant", "next")]
    _, r = render("contextrender", msgs, 6000, signals)
    shown = next(m for m in r.messages if m.tool_call_id == "huge")
    assert shown.rendered_as == "excerpt" and "truncated" in shown.content
    assert shown.content.startswith("x=1 y=2 line") and shown.content.rstrip().endswith("line")


# -- issue 12: shapes real frameworks send ------------------------------------------------------------

def _paired_in_provider_order(r):
    """Each assistant call is directly followed by exactly its results (docs/architecture.md §5.2, §5.7)."""
    for i, m in enumerate(r.messages):
        if m.tool_calls and i + 1 < len(r.messages):
            ids = sorted(c.id for c in m.tool_calls)
            got = [x.tool_call_id for x in r.messages[i + 1:i + 1 + len(ids)]]
            assert sorted(got) == ids, (i, ids, got)


@pytest.mark.parametrize("budget", [6000, 400])
@pytest.mark.parametrize("name", POLICIES)
def test_12_1_message_interposed_between_a_call_and_its_result(name, budget, signals):
    """A framework stores a note while a call is in flight; the result arrives after it. The result
    is rendered directly after its call and the note after it (§5.3 exception), never an error."""
    msgs = [Message("user", "task"), Message("assistant", "", (call("c1"), call("c2"))),
            Message("user", "note: the user is waiting"), Message("tool", "out 1 " + "w " * 150, tool_call_id="c1"),
            Message("assistant", "summary so far"), Message("tool", "out 2 " + "w " * 150, tool_call_id="c2"),
            Message("assistant", "", (call("c3"),)), Message("tool", "out 3", tool_call_id="c3"),
            Message("user", "and now?")]
    g, r = render(name, msgs, budget, signals)
    _paired_in_provider_order(r)
    if budget == 6000:  # fits: the same messages, results moved up to their call
        assert r.messages == [msgs[i] for i in (0, 1, 3, 5, 2, 4, 6, 7, 8)]


def _thinking_loop(big_input_words=300):
    """One Anthropic user turn with extended thinking: the opening assistant message carries the signed
    thinking block and a large tool input, then five more tool steps; the request ends with a result."""
    from historygraph.providers.anthropic import to_canonical
    think = {"type": "thinking", "thinking": "plan the search", "signature": "EqQBCkgIARABGAIiQ=="}
    turns = [{"role": "user", "content": "find the bug"},
             {"role": "assistant", "content": [think, {"type": "tool_use", "id": "t0", "name": "bash",
                                                       "input": {"script": "echo x " * big_input_words}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": "out 0 " + "w " * 200}]}]
    for i in range(1, 6):
        turns += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "bash", "input": {"i": i}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": f"out {i} " + "w " * 200}]}]
    msgs, _ = to_canonical(None, turns)
    return msgs


@pytest.mark.parametrize("name", BUDGETED)
def test_12_2_thinking_block_opening_the_tool_loop_is_protected(name, signals):
    """Anthropic extended thinking: the first assistant message of the active tool loop starts with a
    signed thinking block and must be sent back; a policy never drops it (§5.7), or the budget is too small."""
    msgs = _thinking_loop()
    assert msgs[1].opens_with_thinking
    for budget in (900, 1500):
        g = ContextGraph("think", msgs)
        try:
            r = create(name).render(g, budget, signals)
        except BudgetTooSmallError as exc:
            assert "thinking" in str(exc)
            continue
        check_invariants(r, g, signals.counter)
        assert 1 in r.positions and r.messages[r.positions.index(1)] == msgs[1]


@pytest.mark.parametrize("name", lm_marked(BUDGETED))
def test_12_6_dropped_steps_leave_a_marker_charged_to_the_budget(name, signals):
    """A step left out leaves a short marker where it was, naming the stored positions and how many
    tool calls they hold, charged to B (docs/architecture.md §5.6)."""
    msgs = [Message("user", "task")]
    for i in range(30):
        msgs += [Message("assistant", f"step {i} " * 20, (call(f"c{i}"),)), Message("tool", "out " * 100, tool_call_id=f"c{i}")]
    msgs.append(Message("user", "next"))
    g, r = render(name, msgs, 800, signals)  # check_invariants: every left-out message lies in a marker's span
    markers = [m for m in r.messages if m.rendered_as == "marker"]
    left_out = [p for p in range(1, 61) if p not in r.positions]
    if any(m.rendered_as == "summary" and m.role == "user" for m in r.messages):
        return  # a summary of earlier history stands in for what it covers and names it
    assert left_out and markers
    text = " ".join(m.content for m in markers)
    assert f"#{left_out[0]}–#" in text and "tool calls: " in text and "restore by message number" in text
    assert r.history_tokens <= 800


def test_12_6_marker_text_for_a_known_run():
    """The exact marker for steps 1–2 (and 1–7) of a history: positions and how many calls."""
    from historygraph.render import dropped_marker
    msgs = [Message("user", "t")] + [m for i in range(7) for m in (Message("assistant", "", (call(f"k{i}"),)),
                                                                   Message("tool", "r", tool_call_id=f"k{i}"))]
    g = ContextGraph("m", msgs)
    assert dropped_marker(g, [[1, 2], [3, 4]]).content == \
        "[omitted: messages #1–#4, tool calls: 2; stored in full, restore by message number]"
    many = dropped_marker(g, [[1 + 2 * i, 2 + 2 * i] for i in range(7)]).content
    assert many == "[omitted: messages #1–#14, tool calls: 7; stored in full, restore by message number]"
    # what the marker names comes back by its numbers, each message headed by its number and role
    assert g.recall_text("#1–#2") == g.recall_text("1-2") == \
        f"message #1 (assistant):\n\ntool call k0: bash {msgs[1].tool_calls[0].arguments}\n\nmessage #2 (tool, tool result k0):\nr"
    assert g.recall_text("k3") == "r"
    with pytest.raises(KeyError, match="holds messages #0–#14"):
        g.recall_text("#14–#15")
    with pytest.raises(TypeError, match="give a tool call id or a message number or span as a string .* got NoneType None"):
        g.recall_text(None)  # e.g. a model's tool call without its argument


@pytest.mark.parametrize("name", POLICIES)
def test_12_5_a_late_second_result_for_one_call(name, signals):
    """A framework writes a synthetic error on timeout, then the real result arrives: both are stored,
    the latest is rendered directly after its call, the earlier one is listed as dropped."""
    msgs = [Message("user", "task"), Message("assistant", "", (call("c1"),)),
            Message("tool", "error: timed out", tool_call_id="c1"), Message("assistant", "retrying later"),
            Message("tool", "real output", tool_call_id="c1"), Message("user", "go on")]
    g, r = render(name, msgs, 6000, signals)
    assert [m.content for m in r.messages if m.role == "tool"] == ["real output"]
    assert r.messages[r.positions.index(1) + 1].content == "real output"
    assert 2 in r.dropped and g.messages[2].content == "error: timed out" and g.result_by_id("c1").content == "real output"


def test_12_8_session_render_budget_zero_is_an_error_not_the_default(tmp_path):
    from historygraph import Session
    s = Session("s0")
    s.add(Message("user", "hi"))
    with pytest.raises(ValueError, match="got 0"):
        s.render(budget=0)


def test_12_8_excerpt_at_a_small_size_never_shows_nothing_and_never_exceeds_it(signals):
    """At a size that cannot hold the truncation marker and some text, the placeholder is used
    (before: '0 of 501 tokens shown' and a marker larger than the stated size)."""
    from historygraph.render import excerpt_for
    m = Message("tool", "word " * 500, tool_call_id="big1")
    for size in (16, 30, 60, 200):
        e = excerpt_for(m, size, signals.counter)
        assert "big1" in e.content and " 0 of " not in e.content
        if e.rendered_as == "excerpt":
            assert signals.counter.count_message(e) <= size
        else:
            assert e.rendered_as == "placeholder"


def test_12_2_user_messages_after_a_result_continue_the_thinking_loop():
    """Found by the gate: a result, a note and two user messages merge into one wire user turn holding
    a tool_result, so the loop (and its thinking opening) goes on past them."""
    from historygraph.render import loop_opening
    think = Message("assistant", "", (call("t1"),), provider_blocks='[{"signature":"s","thinking":"p","type":"thinking"}]')
    msgs = [Message("user", "task"), think, Message("tool", "r1", tool_call_id="t1"), Message("user", "see this"),
            Message("user", "and this"), Message("assistant", "", (call("t2"),)), Message("tool", "r2", tool_call_id="t2")]
    assert loop_opening(ContextGraph("l", msgs)) == 1


def _loop_after_a_new_exchange():
    """Found by the gate (cw-hybrid, B = 172): an earlier thinking loop with a note between a call and its
    result, a text reply and a new user message, then a second loop whose opening (signed thinking) has a
    note between its call and its result, and two more steps without thinking. Dropping the text reply
    (the step before the new user message) let its marker and the user message merge into the earlier
    result's wire turn, so the provider's loop began at an assistant message without a thinking block."""
    from historygraph.providers.anthropic import to_canonical
    from fake_upstream import sign

    def think(t):
        return {"type": "thinking", "thinking": t, "signature": sign(t)}

    def use(i, words=0):
        return {"type": "tool_use", "id": f"t{i}", "name": "search", "input": {"q": "x " * words}}

    def res(i):
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": f"out {i} " + "w " * 30}]}
    note = {"role": "user", "content": [{"type": "text", "text": "note: still running"}]}
    turns = [{"role": "user", "content": "task fix it"},
             {"role": "assistant", "content": [think("plan 1"), use(1)]}, res(1),
             {"role": "assistant", "content": [use(2)]}, note, res(2),
             {"role": "assistant", "content": [{"type": "text", "text": "done with that " * 20}]},
             {"role": "user", "content": "thanks, go on"},
             {"role": "assistant", "content": [think("plan 3"), use(3)]}, note, res(3),
             {"role": "assistant", "content": [use(4, 300)]}, res(4),
             {"role": "assistant", "content": [use(5)]}, res(5)]
    return to_canonical("be brief", turns)


def test_12_2_loop_guard_keeps_the_new_exchange_before_the_thinking_opening():
    """The positions every rendering keeps for the active loop: the text reply before the new user
    message, that message and the opening (hand-read from the history: 7, 8, 9); and a call with no
    result does not end a loop (its synthetic result shares the wire turn of the user message after it)."""
    from historygraph.render import loop_guard, loop_opening
    msgs, _ = _loop_after_a_new_exchange()
    assert [msgs[p].role for p in (7, 8, 9)] == ["assistant", "user", "assistant"] and msgs[9].opens_with_thinking
    assert loop_guard(ContextGraph("g", msgs)) == (7, 8, 9)
    think = Message("assistant", "", (call("c1"),), provider_blocks='[{"signature":"s","thinking":"p","type":"thinking"}]')
    unanswered = [Message("user", "task"), think, Message("user", "hi"), Message("assistant", "", (call("c2"),)),
                  Message("tool", "r2", tool_call_id="c2")]
    assert loop_opening(ContextGraph("u", unanswered)) == 1


def _text_reply_inside_the_loop():
    """Found by the gate (recap-noattn, B = 1120 and 1809): one thinking loop in which a call's first
    result is a timeout, the model replies with text only ("waiting"), the real result arrives, then
    two more steps. The late result is rendered right after its call, so the text reply follows it;
    when ReCAP dropped the step after the reply (and kept the reply), that step's marker became a wire
    user turn of its own, without a tool result, and the provider's loop began after it, at an
    assistant message without a thinking block."""
    from historygraph.providers.anthropic import to_canonical
    from fake_upstream import sign

    def use(i, words=0):
        return {"type": "tool_use", "id": f"t{i}", "name": "search", "input": {"q": "x " * words}}

    def res(i, text):
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": text}]}
    turns = [{"role": "user", "content": "task fix it"},
             {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan 1", "signature": sign("plan 1")},
                                               use(1)]}, res(1, "out 1 " + "w " * 30),
             {"role": "assistant", "content": [use(2)]}, res(2, "error: timed out"),
             {"role": "assistant", "content": [{"type": "text", "text": "waiting"}]}, res(2, "out 2 " + "w " * 30),
             {"role": "assistant", "content": [use(3, 300)]}, res(3, "out 3 " + "w " * 300),
             {"role": "assistant", "content": [use(4)]}, res(4, "out 4 " + "w " * 10)]
    return to_canonical("be brief", turns)


@pytest.mark.parametrize("name", lm_marked(BUDGETED))
def test_12_2_a_marker_after_a_text_reply_never_splits_the_thinking_loop(name, signals):
    """Every policy renders :func:`_text_reply_inside_the_loop` (768 tokens of history) at B = 100,
    120, … 760 to a request the fake Anthropic provider accepts with thinking on (before the fix
    recap-noattn was rejected at 27 of these budgets and recap-random at 30: the marker of the
    dropped step t2 stood between the reply "waiting" and the call t4)."""
    from historygraph.providers.anthropic import from_canonical
    from fake_upstream import anthropic_violation
    msgs, pieces = _text_reply_inside_the_loop()
    assert [(m.role, m.content) for m in msgs[6:8]] == [("assistant", "waiting"), ("tool", "out 2 " + "w " * 30)]
    rendered = 0
    for budget in range(100, 770, 20):
        try:
            g, r = render(name, msgs, budget, signals)
        except BudgetTooSmallError:
            continue
        rendered += 1
        wire = from_canonical(r.messages, [pieces[p] if p is not None else None for p in r.positions])
        why = anthropic_violation({"messages": wire, "thinking": {"type": "enabled", "budget_tokens": 1024}})
        assert why is None, (budget, why, r.positions)
    assert rendered > 0


@pytest.mark.parametrize("name", lm_marked(BUDGETED))
def test_12_2_dropping_the_step_before_a_new_exchange_keeps_the_thinking_opening_first(name, signals):
    """At B = 300 and 400 (under the history's 685 tokens) every policy renders the history of
    :func:`_loop_after_a_new_exchange` to a request the fake Anthropic provider accepts with thinking on
    (before the fix most policies were rejected at 300, recap-noattn at 400)."""
    from historygraph.providers.anthropic import from_canonical
    from fake_upstream import anthropic_violation
    msgs, pieces = _loop_after_a_new_exchange()
    for budget in (300, 400):
        g, r = render(name, msgs, budget, signals)
        assert r.history_tokens <= budget and len(r.positions) < len(msgs)
        wire = from_canonical(r.messages, [pieces[p] if p is not None else None for p in r.positions])
        why = anthropic_violation({"messages": wire, "thinking": {"type": "enabled", "budget_tokens": 1024}})
        assert why is None, (budget, why, r.positions)


def test_session_budget_that_is_not_a_whole_number_of_tokens_is_named():
    """Issue 40, item 6: ``Session.render(budget="6k")`` raised an unclear TypeError from a
    comparison; every budget that is not an int >= 1 is now a ValueError naming the value."""
    from historygraph import Session
    s = Session("s1")
    s.add(Message("user", "hi"))
    for bad, said in (("6k", "got '6k' (write 6000, not '6k')"), (6000.0, "got 6000.0"), (True, "got True")):
        with pytest.raises(ValueError, match=re.escape(f"budget must be a whole number of tokens >= 1, {said}")):
            s.render(budget=bad)
    with pytest.raises(ValueError, match="got '3000'"):
        Session("s2", budget="3000")
