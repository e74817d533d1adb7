"""Runs one smolagents ``ToolCallingAgent`` with ``OpenAIServerModel`` (``smolagents[openai]`` in
.clients/smolagents) and a real shell tool, for tests/clients/test_smolagents.py:
``python smolagents_driver.py BASE_URL MODEL WORKDIR``; prints the agent's final answer."""

import subprocess
import sys

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

base_url, model, workdir = sys.argv[1:4]


@tool
def bash(command: str) -> str:
    """Run a shell command in the work folder and return its output.

    Args:
        command: the command line to run with bash.
    """
    return subprocess.run(["bash", "-c", command], cwd=workdir, capture_output=True, text=True, timeout=60).stdout


agent = ToolCallingAgent(tools=[bash], model=OpenAIServerModel(model_id=model, api_base=base_url, api_key="sk-dummy"),
                         max_steps=20, verbosity_level=0)
print("ANSWER:", agent.run("Run the numbered steps."))
