"""The OpenAI Agents SDK (``Runner`` with a real shell ``function_tool``) through the proxy: six
steps of about 450 tokens of output, with ``OpenAIChatCompletionsModel`` and with the SDK's default
model class (``OpenAIResponsesModel``, the Responses API)."""

from __future__ import annotations

import subprocess

import pytest

from harness import need_module


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "default-responses"])
def test_agents_sdk_runs_six_shell_steps(stack, tmp_path, responses):
    need_module("agents")
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def run_shell(command: str) -> str:
        """Run a shell command and return its output."""
        return subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60).stdout

    client = AsyncOpenAI(base_url=stack.url + "/v1", api_key="sk-dummy", max_retries=0)
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(name="stepper", instructions="You run the numbered steps with run_shell.", tools=[run_shell],
                  model=kind(model="script-6", openai_client=client))
    try:
        result = Runner.run_sync(agent, "Run the numbered steps.", max_turns=20)
    except Exception as exc:  # the SDK's own error for a proxy 4xx/5xx
        raise AssertionError(f"the agent failed: {exc}") from exc
    assert result.final_output == "Done: 6 steps."
    stack.check(min_results=6, api="/v1/responses" if responses else "/v1/chat/completions")
