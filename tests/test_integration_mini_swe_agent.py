"""mini-swe-agent: DefaultAgent with a LocalEnvironment (real shell commands in a temporary
folder) and the package's own DeterministicToolcallModel, wrapped in HistoryGraphModel."""

from __future__ import annotations

import json

import pytest

from historygraph import MemoryStore
from historygraph.integrations.mini_swe_agent import HistoryGraphModel


def test_agent_queries_the_rendered_history_and_keeps_its_trajectory(tmp_path):
    # mini-swe-agent is imported here, not at module level, like the other frameworks (docs/tests.md)
    pytest.importorskip("minisweagent", reason="mini-swe-agent not installed (pip install 'historygraph[mini-swe-agent]')")
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.test_models import DeterministicToolcallModel, make_toolcall_output

    class Recording(DeterministicToolcallModel):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.seen: list[list[dict]] = []

        def query(self, messages, **kwargs):
            self.seen.append(messages)
            return super().query(messages, **kwargs)

    def bash(call_id: str, command: str) -> dict:
        call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        return make_toolcall_output(None, [call], [{"command": command, "tool_call_id": call_id}])

    (tmp_path / "big.txt").write_text("line\n" * 200)
    (tmp_path / "small.txt").write_text("line\n" * 150)
    inner = Recording(outputs=[bash("c1", "cat big.txt"), bash("c2", "cat small.txt"),
                               bash("c3", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo done")],
                      observation_template="{{output.output}}")
    store = MemoryStore()
    model = HistoryGraphModel(inner, budget=500, policy="prune", session="msa-1", store=store)
    agent = DefaultAgent(model, LocalEnvironment(cwd=str(tmp_path)), system_template="You are terse.",
                         instance_template="Read big.txt and small.txt, then submit.")
    info = agent.run("")
    assert info["exit_status"] == "Submitted" and info["submission"] == "done\n"
    third = inner.seen[2]
    assert [m["role"] for m in third] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert third[3]["content"].startswith("[tool result c1 omitted from this context (400 tokens)")
    assert third[5]["content"] == "line\n" * 150 and third[5] is agent.messages[5]
    assert agent.messages[3]["content"] == "line\n" * 200  # the trajectory keeps the full output
    assert store.graph("msa-1").result_by_id("c1").content == "line\n" * 200
    assert model.serialize()["info"]["config"]["historygraph"] == {"budget": 500, "policy": "prune"}
    assert model.config is inner.config
