"""The OpenAI Responses API wire format (historygraph.providers.openai_responses): each input item type,
the way back, usage, the stream accumulator over each SSE event; the fake provider's Responses rules
(tests/fake_responses.py); and Anthropic tool-loop text blocks (issue 36.3). Expected values are
written out by hand from the API shapes."""

from __future__ import annotations

import json

import pytest

from historygraph.history.events import EventError, Message, ToolCall
from historygraph.providers import anthropic as anth
from historygraph.providers import openai_responses as resp
from historygraph.server.upstream import SSEParser
from historygraph.signals.calibration import Usage

from fake_responses import response_events, responses_output, responses_violation, seal

REASONING = {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}],
             "encrypted_content": "gAAAAB\u2028opaque==", "status": None}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "search", "arguments": '{"q": 1}', "status": "completed"}
CUSTOM = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"}
SAID = {"type": "message", "role": "assistant", "id": "msg_1",
        "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]}
ITEMS = [
    {"role": "developer", "content": "Use tools."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"},
                                                     {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
    REASONING, SAID, CALL, CUSTOM,
    {"type": "function_call_output", "call_id": "c1", "output": "found it"},
    {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "patched"}]},
    {"type": "compaction", "encrypted_content": "cmp=="},
    {"role": "user", "content": "thanks"},
]


def test_each_input_item_type_becomes_its_canonical_message():
    msgs, pieces = resp.to_canonical("Be brief.", ITEMS)
    assert [m.role for m in msgs] == ["system", "system", "user", "assistant", "tool", "tool", "assistant", "user"]
    assert msgs[0].content == "Be brief." and pieces[0].items == ()  # instructions: not an item
    assert msgs[1].content == "Use tools."  # developer = system
    assert msgs[2].content == "look\n[input_image]"
    group = msgs[3]
    assert group.content == "Looking."
    assert group.tool_calls == (ToolCall("c1", "search", '{"q": 1}'), ToolCall("c2", "apply_patch", "*** Begin Patch"))
    # the reasoning item without its id and None status, keys sorted, non-ASCII kept
    assert group.provider_blocks == ('[{"encrypted_content":"gAAAAB\u2028opaque==","summary":[{"text":"plan",'
                                     '"type":"summary_text"}],"type":"reasoning"}]')
    assert pieces[3].items == (REASONING, SAID, CALL, CUSTOM)
    assert (msgs[4].tool_call_id, msgs[4].content) == ("c1", "found it")
    assert (msgs[5].tool_call_id, msgs[5].content) == ("c2", "patched")
    assert msgs[6].provider_blocks == '[{"encrypted_content":"cmp==","type":"compaction"}]' and msgs[6].content == ""
    assert msgs[7].content == "thanks"


def test_a_string_input_is_one_user_message():
    msgs, pieces = resp.to_canonical(None, "hello")
    assert msgs == [Message("user", "hello")] and pieces == [resp.Piece(("hello",))]


@pytest.mark.parametrize("items, where", [
    ([{"type": "function_call_output", "output": "x"}], "input[0].call_id is missing"),
    ([{"type": "function_call", "call_id": "c", "arguments": "{}"}], "input[0].name is missing"),
    ([{"type": "custom_tool_call", "call_id": "c", "name": "n", "input": 3}], "input[0].input must be a string"),
    ([{"role": "tool", "content": "x"}], "input[0].role must be one of"),
    (["text"], "input[0] must be an object, got str"),
    ([{"content": "no type"}], "input[0].type is missing"),
    ({"role": "user"}, "input must be a string or a list of items, got dict"),
])
def test_bad_input_names_the_item_at_fault(items, where):
    with pytest.raises(EventError, match=f"^{__import__('re').escape(where)}"):
        resp.to_canonical(None, items)


def test_unchanged_rendering_sends_every_item_byte_for_byte_and_leaves_the_instructions_out():
    msgs, pieces = resp.to_canonical("Be brief.", ITEMS)
    out = resp.from_canonical(msgs, pieces)
    assert out == ITEMS and out[2] is REASONING  # the very objects: encrypted_content untouched


def test_changed_messages_are_rebuilt_in_their_item_types():
    msgs, pieces = resp.to_canonical(None, ITEMS)
    shown = [msgs[0], msgs[1], msgs[2].with_content("[brief]", "brief"),
             msgs[3].with_content("[omitted c1]", "placeholder"), msgs[4].with_content("[omitted c2]", "placeholder"),
             Message("user", "[steps left out]", rendered_as="marker")]
    out = resp.from_canonical(shown, [pieces[0], pieces[1], pieces[2], pieces[3], pieces[4], None])
    assert out[:2] == ITEMS[:2]
    # the group keeps its reasoning and calls; its text is the brief, where the text was
    assert out[2:6] == [REASONING, {"role": "assistant", "content": "[brief]"}, CALL, CUSTOM]
    assert out[6] == {"type": "function_call_output", "call_id": "c1", "output": "[omitted c1]"}
    assert out[7] == {"type": "custom_tool_call_output", "call_id": "c2", "output": "[omitted c2]"}
    assert out[8] == {"role": "user", "content": "[steps left out]"}


def test_a_synthetic_result_of_a_custom_call_is_a_custom_tool_call_output():
    msgs, pieces = resp.to_canonical(None, [{"role": "user", "content": "go"}, CUSTOM])
    synthetic = Message("tool", "[no result yet]", tool_call_id="c2", rendered_as="placeholder")
    out = resp.from_canonical([*msgs, synthetic], [*pieces, None])
    assert out[-1] == {"type": "custom_tool_call_output", "call_id": "c2", "output": "[no result yet]"}


def test_usage_counts_cached_and_written_tokens_apart():
    data = {"usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 1},
                      "output_tokens": 2}}
    assert resp.responses_usage(data) == Usage(5, 4, 1)
    assert resp.responses_usage({"type": "response.completed", "response": data}) == Usage(5, 4, 1)
    assert resp.responses_usage({"usage": None}) is None


def test_passthrough_fields():
    assert resp.passthrough_reason({"previous_response_id": "resp_1", "input": []}) == "previous_response_id"
    assert resp.passthrough_reason({"conversation": "conv_1"}) == "conversation"
    assert resp.passthrough_reason({"previous_response_id": None, "input": "x"}) is None


def _stream(body: dict, n: int) -> resp.StreamAccumulator:
    acc, parser = resp.StreamAccumulator(), SSEParser()
    for line in response_events(body, n, responses_output(body, n)):
        for event in parser.feed(line.encode()):
            assert not acc.complete  # complete only at the terminal event
            acc.feed(event)
    return acc


def test_stream_of_a_function_call_gives_the_stored_answer_and_usage():
    body = {"input": "go", "tools": [{"type": "function", "name": "search"}]}
    acc = _stream(body, 7)
    assert acc.complete and acc.usage == Usage(1, 2, 0)
    m = acc.message()
    assert m.tool_calls == (ToolCall("call_7", "search", '{"q": "7"}'),) and m.content == ""
    assert m.provider_blocks == ('[{"encrypted_content":"' + seal("thinking 7") + '","summary":[{"text":"thinking 7",'
                                 '"type":"summary_text"}],"type":"reasoning"}]')


def test_stream_of_text_and_of_a_custom_call():
    assert _stream({"input": "hi"}, 3).message().content == "answer 3"
    m = _stream({"input": "go", "tools": [{"type": "custom", "name": "apply_patch"}]}, 4).message()
    assert m.tool_calls == (ToolCall("call_4", "apply_patch", "q 4"),)


def test_items_from_output_item_done_when_the_final_event_has_no_output():
    acc = resp.StreamAccumulator()
    acc.feed({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "role": "assistant", "content": []}})
    acc.feed({"type": "response.output_text.delta", "output_index": 0, "delta": "ignored: the done item wins"})
    acc.feed({"type": "response.output_item.done", "output_index": 0,
              "item": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}})
    assert acc.message() is None and not acc.complete
    acc.feed({"type": "response.incomplete", "response": {"status": "incomplete", "output": []}})
    assert acc.message().content == "hi"


@pytest.mark.parametrize("terminal", [{"type": "response.failed", "response": {"status": "failed"}},
                                      {"type": "error", "code": "server_error", "message": "boom"}])
def test_a_failed_stream_is_complete_without_an_answer(terminal):
    acc = resp.StreamAccumulator()
    acc.feed(terminal)
    assert acc.complete and acc.message() is None


def test_the_cut_event_is_an_error_event():
    raw = resp.StreamAccumulator.cut_event("upstream stream cut mid-way: x")
    assert raw.startswith(b"event: error\ndata: ")
    event = next(SSEParser().feed(raw))
    assert event == {"type": "error", "code": "upstream_stream_cut", "message": "upstream stream cut mid-way: x",
                     "param": None, "sequence_number": 0}


def test_non_streamed_answer_of_a_failed_response_stores_nothing():
    assert resp.answer_message({"status": "failed", "output": [SAID]}) is None
    assert resp.answer_message({"status": "completed", "output": [SAID]}).content == "Looking."


# ---- the fake provider's Responses rules (tests/fake_responses.py)

GOOD_REASONING = {"id": "rs_9", "type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}], "encrypted_content": seal("t")}
GOOD = [{"role": "user", "content": "go"}, GOOD_REASONING, {**CALL, "id": "fc_9"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"}, {"role": "user", "content": "more"}]


@pytest.mark.parametrize("items, error", [
    (GOOD, None),
    (GOOD[:3], None),  # the last call may be unanswered
    ([GOOD[0], GOOD[3]], "input[1]: No tool call found for function call output with call_id c1."),
    ([GOOD[0], GOOD[2], GOOD[4]], "input[1]: No tool output found for function call c1."),
    ([GOOD[0], {**GOOD_REASONING, "encrypted_content": seal("t") + "x"}, GOOD[2]],
     "input[1]: the encrypted content of reasoning item rs_9 could not be verified"),
    ([GOOD[0], GOOD_REASONING], "input[1]: Item 'rs_9' of type 'reasoning' was provided without its required following item."),
    ([GOOD[0], GOOD_REASONING, GOOD[4]], "input[1]: Item 'rs_9' of type 'reasoning' was provided without its required following item."),
    ([GOOD[0], {"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}],
     "input[1].content[0]: Invalid value: 'input_text'. Supported values are: 'output_text' and 'refusal'."),
    ([GOOD[0], GOOD[0] | {"id": "m"}, GOOD[4] | {"id": "m"}], "input: Duplicate item found with id m"),
    ([GOOD[0], {"type": "custom_tool_call_output", "call_id": "c1", "output": "x"}, GOOD[2]],
     "input[1]: No tool call found for custom tool call output with call_id c1."),
])
def test_fake_enforces_the_responses_input_rules(items, error):
    assert responses_violation({"input": items}) == error


# ---- Anthropic: text a client puts after its tool results (issue 36.3)

def test_text_after_tool_results_stays_in_the_tool_loop_and_is_sent_after_the_results():
    turns = [{"role": "user", "content": "task"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "loaded"},
                                          {"type": "text", "text": "Tool loaded."}]}]
    msgs, pieces = anth.to_canonical(None, turns)
    assert [m.role for m in msgs] == ["user", "assistant", "tool"]  # no new user turn
    assert msgs[2].provider_blocks == '[{"text":"Tool loaded.","type":"text"}]'
    assert anth.from_canonical(msgs, pieces) == turns
    shown = [msgs[0], msgs[1], msgs[2].with_content("[omitted t1]", "placeholder")]
    assert anth.from_canonical(shown, pieces)[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "[omitted t1]"}, {"type": "text", "text": "Tool loaded."}]}
    # counted with the result: its 3 text tokens are inside the JSON the counter charges
    assert json.loads(msgs[2].provider_blocks)[0]["text"] == "Tool loaded."
