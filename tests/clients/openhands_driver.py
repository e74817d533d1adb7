"""Runs one OpenHands SDK agent (``openhands-sdk`` and ``openhands-tools`` in .clients/openhands,
Python 3.12) with its terminal tool, for tests/clients/test_openhands.py:
``python openhands_driver.py BASE_URL MODEL WORKDIR``; prints the agent's last message."""

import sys

from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.tools.terminal import TerminalTool

base_url, model, workdir = sys.argv[1:4]
llm = LLM(model=f"openai/{model}", base_url=base_url, api_key="sk-dummy", usage_id="agent", num_retries=0)
agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name)])
conversation = Conversation(agent=agent, workspace=workdir, max_iteration_per_run=20)
conversation.send_message("Run the numbered steps.")
conversation.run()
print("FINISHED:", conversation.state.execution_status)
