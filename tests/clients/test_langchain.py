"""LangChain (``create_agent`` with ``ChatOpenAI(base_url=...)`` and a real shell tool) through
the proxy: six steps of about 450 tokens of output, by Chat Completions and, with
``use_responses_api=True``, by the Responses API."""

from __future__ import annotations

import subprocess

import pytest

from harness import need_module


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_langchain_agent_runs_six_shell_steps(stack, tmp_path, responses):
    need_module("langchain_openai")
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def run_shell(command: str) -> str:
        """Run a shell command and return its output."""
        return subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60).stdout

    model = ChatOpenAI(model="script-6", base_url=stack.url + "/v1", api_key="sk-dummy", max_retries=0, use_responses_api=responses)
    agent = create_agent(model, tools=[run_shell], system_prompt="You run the numbered steps with run_shell.")
    try:
        out = agent.invoke({"messages": [{"role": "user", "content": "Run the numbered steps."}]}, {"recursion_limit": 40})
    except Exception as exc:  # the client's own error for a proxy 4xx/5xx
        raise AssertionError(f"the agent failed: {exc}") from exc
    assert "Done: 6 steps." in str(out["messages"][-1].content)
    stack.check(min_results=6, api="/v1/responses" if responses else "/v1/chat/completions")
