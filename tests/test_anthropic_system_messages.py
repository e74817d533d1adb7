"""Mid-conversation system messages of the Anthropic Messages API (issue 36: Claude Code puts its
environment block in ``messages`` as a ``{"role": "system"}`` turn after the first user message):
converted to a canonical system message at its place, sent back as the client sent it at the same
place, and accepted by the fake provider only where the API accepts one."""

from __future__ import annotations

import copy

import pytest

from historygraph.providers import anthropic as anth

from fake_upstream import anthropic_violation

ENV = {"role": "system", "content": [{"type": "text", "text": "<env>cwd: /work</env>", "cache_control": {"type": "ephemeral"}}]}


def turns(steps: int = 2) -> list[dict]:
    out: list[dict] = [{"role": "user", "content": "Fix the parser."}, copy.deepcopy(ENV)]
    for i in range(steps):
        out.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"u{i}", "name": "bash", "input": {"i": i}}]})
        out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"u{i}", "content": f"output {i}"}]})
    return out


def test_a_system_turn_is_a_system_message_at_its_place_and_goes_back_unchanged():
    wire = turns()
    messages, pieces = anth.to_canonical("Be brief.", wire)
    assert [m.role for m in messages] == ["system", "user", "system", "assistant", "tool", "assistant", "tool"]
    assert messages[2].content == "<env>cwd: /work</env>"
    assert pieces[0] is None and pieces[2] is not None and pieces[2].value is wire[1]
    out = anth.from_canonical(messages, pieces)
    assert out == wire and out[1] is wire[1]  # the client's own object, cache_control and all
    assert anth.from_canonical(messages[1:], pieces[1:]) == wire  # without the system field too


def test_a_system_turn_rendered_anew_keeps_its_text_at_its_place():
    messages, pieces = anth.to_canonical(None, [{"role": "user", "content": "go"}, {"role": "system", "content": "note"}])
    assert anth.from_canonical(messages, [pieces[0], None]) == [{"role": "user", "content": "go"}]  # no piece: the system field's
    assert anth.from_canonical([messages[0], messages[1].with_content("note", "summary")], pieces) == [
        {"role": "user", "content": "go"}, {"role": "system", "content": "note"}]


@pytest.mark.parametrize("wire", [
    turns(),
    turns()[:2],  # the last message
    [{"role": "user", "content": "go"}, {"role": "system", "content": "a"}, {"role": "system", "content": "b"},
     {"role": "assistant", "content": "ok"}],  # a run of them
], ids=["after-the-first-user-message", "last", "a-run"])
def test_the_fake_accepts_system_turns_where_the_api_does(wire):
    assert anthropic_violation({"messages": wire}) is None


@pytest.mark.parametrize("wire, why", [
    ([ENV, {"role": "user", "content": "go"}], "must follow a user message"),
    ([{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}, ENV], "must follow a user message"),
    ([{"role": "user", "content": "go"}, ENV, {"role": "user", "content": "more"}], "followed by an assistant message"),
    ([{"role": "user", "content": "go"}, {"role": "system", "content": [{"type": "image", "source": {}}]}], "string or text blocks"),
    ([{"role": "user", "content": "go"}, {"role": "developer", "content": "x"}], "'user', 'assistant' or 'system'"),
], ids=["first", "after-an-assistant-turn", "before-a-user-turn", "not-text", "unknown-role"])
def test_the_fake_rejects_system_turns_where_the_api_does(wire, why):
    assert why in (anthropic_violation({"messages": wire}) or "")


def test_tool_results_still_pair_across_a_system_turn():
    wire = turns()
    del wire[3]  # the first call's result: its call is unanswered
    assert "tool_result" in (anthropic_violation({"messages": wire}) or "")
