"""mini-swe-agent: DefaultAgent with a LocalEnvironment (real shell commands in a temporary
folder) and the package's own DeterministicToolcallModel, wrapped in HistoryGraphModel."""

from __future__ import annotations

import json
import re

import pytest

from historygraph import MemoryStore
from historygraph.integrations.mini_swe_agent import HistoryGraphModel

PLACEHOLDER_ID = re.compile(r"\[tool result (\S+) omitted from this context")


def test_agent_queries_the_rendered_history_and_keeps_its_trajectory(tmp_path):
    # mini-swe-agent is imported here, not at module level, like the other frameworks (docs/tests.md)
    pytest.importorskip("minisweagent", reason="mini-swe-agent not installed (pip install -e '.[mini-swe-agent]' in the clone)")
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


def test_the_model_recalls_an_omitted_result_by_the_id_its_placeholder_names(tmp_path):
    pytest.importorskip("minisweagent", reason="mini-swe-agent not installed (pip install -e '.[mini-swe-agent]' in the clone)")
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.test_models import DeterministicToolcallModel, make_toolcall_output

    from historygraph.integrations.mini_swe_agent import RECALL_HINT, HistoryGraphEnvironment

    def bash(call_id: str, command: str) -> dict:
        call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        return make_toolcall_output(None, [call], [{"command": command, "tool_call_id": call_id}])

    class Recalling(DeterministicToolcallModel):
        """Reads both files, runs the recall command with the id the first placeholder in its input
        names (taken from the input, not from a script), then submits how many lines the latest
        output holds."""

        def __init__(self, **kwargs):
            super().__init__(outputs=[], **kwargs)
            self.seen: list[list[dict]] = []

        def query(self, messages, **kwargs):
            self.seen.append(messages)
            n = len(self.seen)
            if n <= 2:
                return bash(f"c{n}", "cat big.txt" if n == 1 else "cat small.txt")
            if n == 3:
                ids = [m.group(1) for x in messages if x["role"] == "tool" and (m := PLACEHOLDER_ID.match(x["content"]))]
                return bash("r1", f"historygraph recall {ids[0]}")
            lines = messages[-1]["content"].count("line")
            return bash("c4", f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo lines seen in full: {lines}")

    (tmp_path / "big.txt").write_text("line\n" * 200)
    (tmp_path / "small.txt").write_text("line\n" * 150)
    inner, store = Recalling(observation_template="{{output.output}}"), MemoryStore()
    model = HistoryGraphModel(inner, budget=500, policy="prune", store=store)
    env = HistoryGraphEnvironment(LocalEnvironment(cwd=str(tmp_path)), model)
    agent = DefaultAgent(model, env, system_template="You are terse. " + RECALL_HINT,
                         instance_template="Read big.txt and small.txt, then submit.", cost_limit=10)
    info = agent.run("")
    assert inner.seen[2][3]["content"].startswith("[tool result c1 omitted from this context (400 tokens)")
    assert inner.seen[3][-1]["content"] == "line\n" * 200  # the recall command's output: the whole result, as it was
    assert info["exit_status"] == "Submitted" and info["submission"] == "lines seen in full: 200\n"
    assert env.config is env.env.config  # everything else is the wrapped environment's


def test_only_a_lone_recall_command_is_answered(tmp_path):
    from historygraph.integrations.mini_swe_agent import HistoryGraphEnvironment, recall_ids

    assert recall_ids("historygraph recall c1 'c 2'") == ["c1", "c 2"] and recall_ids("historygraph recall 3-5") == ["3-5"]
    assert recall_ids("historygraph recall #3-#5") == []  # bash reads '#' as a comment: the usage is answered
    for cmd in ("historygraph recall c1 && rm x", "historygraph recall c1 | head", "historygraph recall c1 > out",
                "historygraph recall c1\nls", "echo historygraph recall c1", "historygraph recall 'c1"):
        assert recall_ids(cmd) is None, cmd

    class Env:
        def execute(self, action, cwd="", *, timeout=None):
            return {"output": "ran " + action["command"], "returncode": 0, "exception_info": ""}

    with pytest.raises(ValueError, match="session= or store="):
        HistoryGraphEnvironment(Env(), HistoryGraphModel(Env(), budget=500))
    env = HistoryGraphEnvironment(Env(), HistoryGraphModel(Env(), budget=500, session="none-yet", store=MemoryStore()))
    assert env.execute({"command": "ls"})["output"] == "ran ls"
    assert env.execute({"command": "historygraph recall c1"})["output"] == "[historygraph_recall: nothing of this conversation is stored yet]\n"
    assert env.execute({"command": "historygraph recall"})["returncode"] == 2
    # chained with another command: not sent to the shell (where it would be 'historygraph: not found', 127)
    chained = env.execute({"command": "historygraph recall call_0 && ls"})
    assert chained["returncode"] == 2 and "command of its own" in chained["output"]
    assert env.execute({"command": "echo historygraph recall c1"})["output"] == "ran echo historygraph recall c1"


MODEL_CLASS = "historygraph.integrations.mini_swe_agent.HistoryGraphModel"


def _scripted_config(tmp_path) -> dict:
    """A mini-swe-agent config whose ``model`` section selects HistoryGraphModel by import path and
    names the wrapped class (the package's DeterministicToolcallModel) and its scripted outputs."""
    def bash(call_id: str, command: str) -> dict:
        call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        return {"role": "assistant", "content": None, "tool_calls": [call],
                "extra": {"actions": [{"command": command, "tool_call_id": call_id}], "cost": 1.0}}

    (tmp_path / "big.txt").write_text("line\n" * 200)
    (tmp_path / "small.txt").write_text("line\n" * 150)
    return {
        "agent": {"system_template": "You are terse.", "instance_template": "Read big.txt and small.txt, then submit."},
        "environment": {"environment_class": "local", "cwd": str(tmp_path)},
        "model": {"model_class": MODEL_CLASS, "model_name": "scripted", "history_budget": 500, "policy": "prune",
                  "store": ":memory:", "session": "yaml-1",
                  "wrapped_model_class": "minisweagent.models.test_models.DeterministicToolcallModel",
                  "observation_template": "{{output.output}}",
                  "outputs": [bash("c1", "cat big.txt"), bash("c2", "cat small.txt"),
                              bash("c3", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo done")]},
    }


def test_a_yaml_config_selects_the_wrapper_through_mini_swe_agents_own_loader(tmp_path):
    pytest.importorskip("minisweagent", reason="mini-swe-agent not installed (pip install 'historygraph[mini-swe-agent]')")
    import yaml
    from minisweagent.agents import get_agent
    from minisweagent.config import get_config_from_spec
    from minisweagent.environments import get_environment
    from minisweagent.models import get_model
    from minisweagent.models.test_models import DeterministicToolcallModel

    path = tmp_path / "hg.yaml"
    path.write_text(yaml.safe_dump(_scripted_config(tmp_path)))
    config = get_config_from_spec(str(path))
    model = get_model(config=config["model"])
    assert isinstance(model, HistoryGraphModel) and isinstance(model.model, DeterministicToolcallModel)
    assert (model.budget, model.policy, model.session, type(model.store)) == (500, "prune", "yaml-1", MemoryStore)
    assert model.config is model.model.config and model.config.model_name == "scripted"
    seen, query = [], model.model.query
    model.model.query = lambda messages, **kw: (seen.append(messages), query(messages, **kw))[1]
    agent = get_agent(model, get_environment(config["environment"]), config["agent"], default_type="default")
    info = agent.run("")
    assert info["exit_status"] == "Submitted" and info["submission"] == "done\n"
    assert [m["role"] for m in seen[2]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert seen[2][3]["content"].startswith("[tool result c1 omitted from this context (400 tokens)")
    assert seen[2][5]["content"] == "line\n" * 150 and agent.messages[3]["content"] == "line\n" * 200
    assert model.store.graph("yaml-1").result_by_id("c1").content == "line\n" * 200
    assert model.serialize()["info"]["config"]["historygraph"] == {"budget": 500, "policy": "prune"}


def test_the_mini_command_line_selects_the_wrapper_with_model_class(tmp_path, monkeypatch):
    pytest.importorskip("minisweagent", reason="mini-swe-agent not installed (pip install 'historygraph[mini-swe-agent]')")
    import yaml
    from minisweagent.run.mini import main

    config = _scripted_config(tmp_path)
    del config["model"]["model_class"]  # chosen on the command line instead
    path = tmp_path / "hg.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("MSWEA_CONFIGURED", "1")  # no first-run setup prompt
    agent = main(model_name=None, model_class=MODEL_CLASS, agent_class=None, environment_class=None,
                 task="go", yolo=True, cost_limit=0, config_spec=[str(path), "model.history_budget=500"],
                 output=tmp_path / "traj.json", exit_immediately=True)
    assert isinstance(agent.model, HistoryGraphModel) and agent.model.budget == 500
    shown = agent.model.last_rendering.messages  # the third query's rendering
    assert shown[3].content.startswith("[tool result c1 omitted from this context (400 tokens)")
    assert agent.model.last_rendering.policy == "prune-stable"  # cache-stable by default (issue 49)
    assert json.loads((tmp_path / "traj.json").read_text())["info"]["config"]["historygraph"] == {"budget": 500, "policy": "prune"}


def test_a_config_with_a_bad_key_is_refused_by_name():
    pytest.importorskip("minisweagent", reason="mini-swe-agent not installed (pip install 'historygraph[mini-swe-agent]')")
    from minisweagent.models import get_model

    from historygraph import PolicyError

    base = {"model_class": MODEL_CLASS, "model_name": "x", "wrapped_model_class": "deterministic", "outputs": []}
    with pytest.raises(ValueError, match="history_budget"):
        get_model(config=base)
    with pytest.raises(ValueError, match="history_budget must be a positive integer"):
        get_model(config={**base, "history_budget": "6000 tokens"})
    with pytest.raises(PolicyError, match="unknown policy 'nope'"):
        get_model(config={**base, "history_budget": 500, "policy": "nope"})
    with pytest.raises(TypeError, match="not both"):
        HistoryGraphModel(object(), budget=500, model_name="x")


@pytest.mark.parametrize("config", ["default.yaml", "mini.yaml", "mini_textbased.yaml"])
def test_a_recalled_observation_is_wrapped_by_the_template_once(tmp_path, config):
    """With each observation template mini-swe-agent ships (XML tags; JSON through tojson), the
    recall command's observation is the recalled one as the agent first saw it: the template's
    rendering of the same output, not that rendering wrapped in the template again."""
    pytest.importorskip("minisweagent", reason="mini-swe-agent not installed (pip install -e '.[mini-swe-agent]' in the clone)")
    import yaml
    from jinja2 import StrictUndefined, Template
    from minisweagent.config import builtin_config_dir

    from historygraph.history.events import Message
    from historygraph.integrations.mini_swe_agent import HistoryGraphEnvironment

    template = yaml.safe_load((builtin_config_dir / config).read_text())["model"]["observation_template"]
    output = 'a "quoted" line\\n with a backslash\n' * 3
    first = Template(template, undefined=StrictUndefined).render(output={"output": output, "returncode": 0, "exception_info": ""})
    store = MemoryStore()
    store.create_session("msa-w")
    store.append("msa-w", [Message.from_openai(m) for m in (
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": first})])

    class Inner:
        class config:  # noqa: N801 (the wrapped model's config object)
            observation_template = template

    model = HistoryGraphModel(Inner(), budget=500, session="msa-w", store=store)
    out = HistoryGraphEnvironment(object(), model).execute({"command": "historygraph recall c1"})
    assert out["output"] == output and out["returncode"] == 0
    again = Template(template, undefined=StrictUndefined).render(output=out)
    assert again == first
