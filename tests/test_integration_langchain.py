"""LangChain v1 agent with HistoryGraphMiddleware: the real create_agent loop, a scripted model,
a real tool, no network."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from historygraph import MemoryStore

# slow: importing LangChain costs about 2 CPU s in the process that runs these tests (docs/tests.md)
pytestmark = pytest.mark.slow

PLACEHOLDER_ID = re.compile(r"\[tool result (\S+) omitted from this context")
FILES = {"big.txt": "line\n" * 200, "small.txt": "line\n" * 150}  # 400 and 300 tokens (o200k_base)


@pytest.fixture(scope="module")
def lc() -> SimpleNamespace:
    """LangChain's agent loop, a file-reading tool and the scripted model. Imported here, not at
    module level: every test process collects this file, and importing LangChain costs about 2 CPU s
    (docs/tests.md)."""
    pytest.importorskip("langchain.agents", reason="langchain not installed (pip install -e '.[langchain]' in the clone)")
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool

    from historygraph.integrations.langchain import HistoryGraphMiddleware

    @tool
    def read(path: str) -> str:
        """Read a file."""
        return FILES[path]

    class RecordingModel(GenericFakeChatModel):
        """Answers from a script and records the messages of every call."""

        seen: list = []

        def bind_tools(self, tools: Any, **kwargs: Any) -> "RecordingModel":
            return self

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            self.seen.append(list(messages))
            return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    class RecallingModel(RecordingModel):
        """Reads both files, then calls the recall tool with the id the first placeholder it sees
        names (taken from its input, not from the script), then says how many lines it has seen in
        full; records the tool names it was bound to."""

        bound: list = []

        def bind_tools(self, tools: Any, **kwargs: Any) -> "RecallingModel":
            self.bound.append([t.name for t in tools])
            return self

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            self.seen.append(list(messages))
            n = len(self.seen)
            if n <= 2:
                path = "big.txt" if n == 1 else "small.txt"
                reply = AIMessage("", tool_calls=[{"id": f"c{n}", "name": "read", "args": {"path": path}}])
            elif n == 3:
                ids = [m.group(1) for x in messages if (m := PLACEHOLDER_ID.match(str(x.content)))]
                reply = AIMessage("", tool_calls=[{"id": "r1", "name": "historygraph_recall", "args": {"ids": ids[:1]}}])
            else:
                reply = AIMessage(f"lines seen in full: {str(messages[-1].content).count('line')}")
            return ChatResult(generations=[ChatGeneration(message=reply)])

    def script() -> RecordingModel:
        return RecordingModel(seen=[], messages=iter([
            AIMessage("", tool_calls=[{"id": "c1", "name": "read", "args": {"path": "big.txt"}}]),
            AIMessage("", tool_calls=[{"id": "c2", "name": "read", "args": {"path": "small.txt"}}]),
            AIMessage("Both files hold only 'line'."),
        ]))

    return SimpleNamespace(create_agent=create_agent, HumanMessage=HumanMessage, ToolMessage=ToolMessage,
                           Middleware=HistoryGraphMiddleware, read=read, script=script,
                           recalling=lambda: RecallingModel(seen=[], bound=[], messages=iter([])))


def test_agent_model_sees_the_rendering_and_state_keeps_everything(lc):
    model, store = lc.script(), MemoryStore()
    mw = lc.Middleware(budget=500, policy="prune", session="lc-1", store=store)
    agent = lc.create_agent(model, tools=[lc.read], system_prompt="You are terse.", middleware=[mw])
    state = agent.invoke({"messages": [lc.HumanMessage("What is in big.txt and small.txt?")]})
    assert len(model.seen) == 3
    third = model.seen[2]
    assert third[0].type == "system" and third[0].content == "You are terse."
    results = [m for m in third if isinstance(m, lc.ToolMessage)]
    assert [r.tool_call_id for r in results] == ["c1", "c2"]
    assert results[0].content.startswith("[tool result c1 omitted from this context (400 tokens)")
    assert results[1].content == FILES["small.txt"]
    # the agent's state is untouched: the full result is still there, and stored by id
    full = [m for m in state["messages"] if isinstance(m, lc.ToolMessage)]
    assert full[0].content == FILES["big.txt"]
    assert store.graph("lc-1").result_by_id("c1").content == FILES["big.txt"]
    assert mw.last_rendering is not None and mw.last_rendering.omitted == [3]
    assert state["messages"][-1].content == "Both files hold only 'line'."


def test_async_agent_uses_awrap_model_call(lc):
    import asyncio

    model = lc.script()
    mw = lc.Middleware(budget=500, policy="prune")
    agent = lc.create_agent(model, tools=[lc.read], middleware=[mw])
    asyncio.run(agent.ainvoke({"messages": [lc.HumanMessage("What is in big.txt and small.txt?")]}))
    results = [m for m in model.seen[2] if isinstance(m, lc.ToolMessage)]
    assert "omitted" in results[0].content and results[1].content == FILES["small.txt"]
    assert mw.last_rendering.policy == "prune-stable"  # without a store too (issue 49; docs/library.md)


def test_under_budget_the_model_gets_the_same_objects(lc):
    model = lc.script()
    agent = lc.create_agent(model, tools=[lc.read], middleware=[lc.Middleware(budget=100_000, policy="prune")])
    state = agent.invoke({"messages": [lc.HumanMessage("What is in big.txt and small.txt?")]})
    assert [m.content for m in model.seen[2]] == [m.content for m in state["messages"][:5]]


def test_with_a_store_the_thread_id_names_the_session(lc):
    model, store = lc.script(), MemoryStore()
    agent = lc.create_agent(model, tools=[lc.read], middleware=[lc.Middleware(budget=500, policy="prune", store=store)])
    agent.invoke({"messages": [lc.HumanMessage("What is in big.txt and small.txt?")]},
                 config={"configurable": {"thread_id": "thread-7"}})
    assert store.sessions() == ["thread-7"] and len(store.messages("thread-7")) == 5  # user, 2 calls, 2 results


def test_the_model_recalls_an_omitted_result_by_the_id_its_placeholder_names(lc):
    model, store = lc.recalling(), MemoryStore()
    mw = lc.Middleware(budget=500, policy="prune", store=store, recall=True)
    agent = lc.create_agent(model, tools=[lc.read], middleware=[mw])
    state = agent.invoke({"messages": [lc.HumanMessage("What is in big.txt and small.txt?")]},
                         config={"configurable": {"thread_id": "t-recall"}})
    assert sorted(model.bound[0]) == ["historygraph_recall", "read"]  # the middleware's tool reached the model
    third = [m.content for m in model.seen[2] if isinstance(m, lc.ToolMessage)]
    assert third[0].startswith("[tool result c1 omitted from this context (400 tokens)")
    recalled = [m for m in model.seen[3] if isinstance(m, lc.ToolMessage) and m.tool_call_id == "r1"]
    assert [m.content for m in recalled] == [FILES["big.txt"]]  # the complete result, byte for byte
    assert state["messages"][-1].content == "lines seen in full: 200"
    assert mw.last_session == "t-recall"


def test_recall_needs_somewhere_stored(lc):
    with pytest.raises(ValueError, match="recall=True needs session= or store="):
        lc.Middleware(budget=500, recall=True)
    assert lc.Middleware(budget=500).tools == []
