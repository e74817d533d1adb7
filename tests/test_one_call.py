"""The one-call API (historygraph.render_messages / render_anthropic_messages)."""

from __future__ import annotations

import copy

import pytest

from historygraph import (BudgetTooSmallError, EventError, MemoryStore, PolicyError, Rendered, create,
                          render_anthropic_messages, render_messages)

BIG = "\n".join(f"row {i}: value {i * 7}" for i in range(400))  # ~3,600 tokens, cannot fit in B = 400


def openai_conversation() -> list[dict]:
    return [
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": "Sum the big table and check the small one."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"f": "big"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": BIG},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "read", "arguments": '{"f": "small"}'}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "small: 3 rows", "x-extra": "kept"},
        {"role": "user", "content": "And the total?"},
    ]


def test_openai_messages_omit_what_does_not_fit_and_keep_the_callers_objects():
    msgs = openai_conversation()
    before = copy.deepcopy(msgs)
    out = render_messages(msgs, budget=400, policy="prune")
    assert msgs == before  # the caller's list is not modified
    assert len(out) == 7
    # unchanged messages are the caller's own objects (the developer role and unknown fields survive)
    for i in (0, 1, 2, 4, 5, 6):
        assert out[i] is msgs[i]
    assert out[3]["role"] == "tool" and out[3]["tool_call_id"] == "c1"
    assert "tool result c1" in out[3]["content"] and out[3]["content"] != BIG


def test_explain_gives_the_rendering_with_reasons():
    r = render_messages(openai_conversation(), budget=400, policy=create("cw-sliding-window", n=1), explain=True)
    assert isinstance(r, Rendered) and r.session_id is None
    assert r.rendering.omitted == [3] and r.rendering.full == [5]
    assert r.rendering.reasons[3] == "omitted: older than the 1 most recent observations"
    assert r.rendering.reasons[0] == "outside B: system message"
    assert r.rendering.history_tokens <= 400


def test_everything_fits_is_the_input_unchanged():
    msgs = openai_conversation()
    assert render_messages(msgs, budget=100_000, policy="prune") == msgs


def test_a_session_stores_only_what_is_new_and_branches_on_an_edit():
    store = MemoryStore()
    msgs = openai_conversation()
    r1 = render_messages(msgs[:4], budget=400, policy="prune", session="run-1", store=store, explain=True)
    assert r1.session_id == "run-1" and len(store.messages("run-1")) == 4
    r2 = render_messages(msgs, budget=400, policy="prune", session="run-1", store=store, explain=True)
    assert r2.session_id == "run-1" and len(store.messages("run-1")) == 7
    assert store.sessions() == ["run-1"]
    # the stored result is complete even though the rendering omitted it
    assert store.graph("run-1").result_by_id("c1").content == BIG
    edited = [*msgs[:1], {"role": "user", "content": "Only the small table."}, *msgs[2:]]
    r3 = render_messages(edited, budget=400, policy="prune", session="run-1", store=store, explain=True)
    assert r3.session_id == "run-1~1"
    assert store.session_meta("run-1~1")["forked_at"] == 1
    assert len(store.messages("run-1")) == 7  # nothing stored is overwritten


def test_a_session_without_a_store_lives_in_the_process_store():
    from historygraph.api import default_store

    msgs = openai_conversation()
    render_messages(msgs[:4], budget=400, policy="prune", session="one-call-default")
    render_messages(msgs, budget=400, policy="prune", session="one-call-default")
    assert len(default_store().messages("one-call-default")) == 7


def test_a_policy_instance_with_parameters():
    out = render_messages(openai_conversation(), budget=400, policy=create("cw-sliding-window", n=0))
    assert out[3]["content"].startswith("[tool result c1 omitted from this context (")  # a window of no observations
    assert out[5]["content"] == "small: 3 rows"  # but the newest result is shown whatever the policy (invariant §5.9)


def test_bad_input_names_what_is_wrong():
    msgs = openai_conversation()
    with pytest.raises(EventError, match=r"messages\[2\]"):
        render_messages([msgs[1], msgs[1], {"role": "wizard", "content": "x"}], budget=400)
    call = {"type": "function", "function": {"name": "bash", "arguments": "{}"}}  # the second call has no id
    with pytest.raises(EventError, match=r"^messages\[1\]: tool_calls\[1\]\.id is missing$"):
        render_messages([msgs[1], {"role": "assistant", "content": None, "tool_calls": [dict(call, id="a"), call]}], budget=400)
    with pytest.raises(ValueError, match="budget must be a positive integer"):
        render_messages(msgs, budget=0, policy="prune")
    with pytest.raises(PolicyError, match="unknown policy 'prun'; did you mean prune[ ?]") as exc:
        render_messages(msgs, budget=400, policy="prun")
    known = str(exc.value).split("known: ")[1].split(", ")  # what the library can run: no clairvoyant bound
    assert "prune" in known and "learned" in known and "oracle" not in known and "oracle-omit" not in known
    with pytest.raises(BudgetTooSmallError):
        render_messages(msgs, budget=5, policy="prune")


def anthropic_conversation() -> list[dict]:
    return [
        {"role": "user", "content": "Sum the big table and check the small one."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "two reads", "signature": "sig=="},
            {"type": "tool_use", "id": "t1", "name": "read", "input": {"f": "big"}},
            {"type": "tool_use", "id": "t2", "name": "read", "input": {"f": "small"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": BIG},
            {"type": "tool_result", "tool_use_id": "t2", "content": "small: 3 rows"}]},
        {"role": "user", "content": "And the total?"},
    ]


def test_anthropic_messages_keep_turns_and_originals():
    msgs = anthropic_conversation()
    r = render_anthropic_messages(msgs, system="You are terse.", budget=400, policy="prune", explain=True)
    out = r.messages
    assert [m["role"] for m in out] == ["user", "assistant", "user", "user"]
    assert out[0] == msgs[0] and out[1] is msgs[1]  # thinking block with its signature untouched
    first, second = out[2]["content"]
    assert first["type"] == "tool_result" and first["tool_use_id"] == "t1"
    assert "t1" in first["content"] and BIG not in first["content"]
    assert second is msgs[2]["content"][1]
    # canonical positions: 0 system, 1 user, 2 assistant, 3 t1, 4 t2, 5 user
    assert r.rendering.omitted == [3]


def test_anthropic_session_appends_only_what_is_new():
    store = MemoryStore()
    msgs = anthropic_conversation()
    render_anthropic_messages(msgs[:3], system="S", budget=400, policy="prune", session="a", store=store)
    n = len(store.messages("a"))
    render_anthropic_messages(msgs, system="S", budget=400, policy="prune", session="a", store=store)
    assert (n, len(store.messages("a"))) == (5, 6) and store.sessions() == ["a"]


def test_anthropic_bad_input_names_the_field():
    with pytest.raises(EventError, match=r"messages\[0\]\.role"):
        render_anthropic_messages([{"role": "tool", "content": "x"}], budget=400)
