"""OpenAI Agents SDK with HistoryGraphInputFilter: the real Runner loop and function tools, a
scripted Model, tracing off, no network."""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from historygraph import EventError, MemoryStore

# slow: importing the Agents SDK costs about 2.5 CPU s in the process that runs these tests (docs/tests.md)
pytestmark = pytest.mark.slow

PLACEHOLDER_ID = re.compile(r"\[tool result (\S+) omitted from this context")
FILES = {"big.txt": "line\n" * 200, "small.txt": "line\n" * 150}  # 400 and 300 tokens (o200k_base)


@pytest.fixture(scope="module")
def oa() -> SimpleNamespace:
    """The Agents SDK, a file-reading function tool, the scripted model and the response items it
    returns. Imported here, not at module level: every test process collects this file, and importing
    the SDK costs about 2.5 CPU s (docs/tests.md)."""
    pytest.importorskip("agents", reason="openai-agents not installed (pip install -e '.[openai-agents]' in the clone)")
    from agents import Agent, RunConfig, Runner, Usage, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from historygraph.integrations.openai_agents import HistoryGraphInputFilter, items_to_events

    @function_tool
    def read(path: str) -> str:
        """Read a file."""
        return FILES[path]

    def call(call_id: str, path: str) -> ResponseFunctionToolCall:
        return ResponseFunctionToolCall(type="function_call", call_id=call_id, name="read",
                                        arguments=f'{{"path": "{path}"}}', id=f"fc_{call_id}", status="completed")

    def text(t: str) -> ResponseOutputMessage:
        return ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed",
                                     content=[ResponseOutputText(type="output_text", text=t, annotations=[])])

    class ScriptedModel(Model):
        """Returns the scripted outputs in turn and records (instructions, input) of every call."""

        def __init__(self, outputs: list[list[Any]]) -> None:
            self.outputs, self.seen = outputs, []

        async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                               tracing, *, previous_response_id, conversation_id, prompt):
            self.seen.append((system_instructions, input))
            return ModelResponse(output=self.outputs[len(self.seen) - 1], usage=Usage(), response_id=None)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    class RecallingModel(ScriptedModel):
        """Reads both files, then calls the recall tool with the id the first placeholder in its
        input names (taken from the input, not from a script), then says how many lines the
        latest output holds; records the tool names of every call."""

        def __init__(self) -> None:
            super().__init__([])
            self.tools: list[list[str]] = []

        async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                               tracing, *, previous_response_id, conversation_id, prompt):
            self.seen.append((system_instructions, input))
            self.tools.append([t.name for t in tools])
            n, outputs = len(self.seen), [i["output"] for i in input if i.get("type") == "function_call_output"]
            if n <= 2:
                out: list[Any] = [call(f"c{n}", "big.txt" if n == 1 else "small.txt")]
            elif n == 3:
                ids = [m.group(1) for o in outputs if (m := PLACEHOLDER_ID.match(o))]
                out = [ResponseFunctionToolCall(type="function_call", call_id="r1", name="historygraph_recall",
                                                arguments=json.dumps({"ids": ids[:1]}), id="fc_r1", status="completed")]
            else:
                out = [text(f"lines seen in full: {outputs[-1].count('line')}")]
            return ModelResponse(output=out, usage=Usage(), response_id=None)

    return SimpleNamespace(Agent=Agent, RunConfig=RunConfig, Runner=Runner, read=read, call=call, text=text,
                           ScriptedModel=ScriptedModel, RecallingModel=RecallingModel, InputFilter=HistoryGraphInputFilter,
                           items_to_events=items_to_events)


def test_runner_model_sees_the_rendering(oa):
    model = oa.ScriptedModel([[oa.call("c1", "big.txt")], [oa.call("c2", "small.txt")], [oa.text("Both hold 'line'.")]])
    agent = oa.Agent(name="reader", instructions="You are terse.", tools=[oa.read], model=model)
    store = MemoryStore()
    flt = oa.InputFilter(budget=500, policy="prune", session="oa-1", store=store)
    result = asyncio.run(oa.Runner.run(agent, "What is in big.txt and small.txt?",
                                       run_config=oa.RunConfig(call_model_input_filter=flt, tracing_disabled=True)))
    assert result.final_output == "Both hold 'line'."
    instructions, items = model.seen[2]
    assert instructions == "You are terse."
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["c1", "c2"]
    assert outputs[0]["output"].startswith("[tool result c1 omitted from this context (400 tokens)")
    assert outputs[1]["output"] == FILES["small.txt"]
    # both calls still precede their outputs, and the run's own items are complete
    kinds = [i.get("type") or i.get("role") for i in items]
    assert kinds == ["user", "function_call", "function_call_output", "function_call", "function_call_output"]
    assert [i.to_input_item()["output"] for i in result.new_items if i.type == "tool_call_output_item"][0] == FILES["big.txt"]
    assert store.graph("oa-1").result_by_id("c1").content == FILES["big.txt"]
    assert flt.last_rendering.omitted == [3]  # 0 instructions, 1 user, 2 call, 3 output


def test_items_to_events_groups_calls_with_their_message_and_reasoning(oa):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "go"}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]},
             {"type": "function_call", "call_id": "a", "name": "read", "arguments": "{}"},
             {"type": "function_call", "call_id": "b", "name": "read", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "a", "output": "A"},
             {"type": "function_call_output", "call_id": "b", "output": "B"}]
    events, owned = oa.items_to_events(items, "sys")
    assert [(e.role, e.content) for e in events] == [("system", "sys"), ("user", "go"), ("assistant", "Reading."),
                                                     ("tool", "A"), ("tool", "B")]
    assert [c.id for c in events[2].tool_calls] == ["a", "b"]
    assert owned[2] == items[1:5]  # the reasoning item travels with its message


def test_a_bad_item_names_its_index(oa):
    with pytest.raises(EventError, match=r"input\[1\] \(function_call\): call_id is missing"):
        oa.items_to_events([{"role": "user", "content": "x"}, {"type": "function_call", "name": "read"}])


def test_the_model_recalls_an_omitted_result_by_the_id_its_placeholder_names(oa):
    model, store = oa.RecallingModel(), MemoryStore()
    flt = oa.InputFilter(budget=500, policy="prune", store=store)
    agent = oa.Agent(name="reader", tools=[oa.read, flt.recall_tool()], model=model)
    result = asyncio.run(oa.Runner.run(agent, "What is in big.txt and small.txt?",
                                       run_config=oa.RunConfig(call_model_input_filter=flt, tracing_disabled=True)))
    assert model.tools[0] == ["read", "historygraph_recall"]
    third = [i["output"] for i in model.seen[2][1] if i.get("type") == "function_call_output"]
    assert third[0].startswith("[tool result c1 omitted from this context (400 tokens)")
    fourth = {i["call_id"]: i["output"] for i in model.seen[3][1] if i.get("type") == "function_call_output"}
    assert fourth["r1"] == FILES["big.txt"]  # the complete result, byte for byte
    assert result.final_output == "lines seen in full: 200"
    assert flt.last_session in store.sessions()


def test_recall_tool_needs_somewhere_stored(oa):
    with pytest.raises(ValueError, match="session= or store="):
        oa.InputFilter(budget=500).recall_tool()
