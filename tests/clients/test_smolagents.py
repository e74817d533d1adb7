"""smolagents (``smolagents[openai]`` in .clients/smolagents, pinned in scripts/install-clients.sh):
a ``ToolCallingAgent`` with ``OpenAIServerModel`` and a real shell tool runs eight steps of about
450 tokens of output through the proxy's ``/v1/chat/completions`` (tests/clients/smolagents_driver.py).
smolagents restates each call it made as assistant text and each output as a user message
(historygraph.providers.text_calls): the run is one session, rendered under B, and what the
provider gets is in smolagents' own form."""

from __future__ import annotations

from pathlib import Path

import httpx

from harness import CLIENTS, need, run

PYTHON = CLIENTS / "smolagents" / "bin" / "python"
DRIVER = Path(__file__).resolve().parent / "smolagents_driver.py"


def test_smolagents_tool_calling_agent_runs_eight_shell_steps_in_one_session(stack, tmp_path):
    exe = need(PYTHON, "smolagents")
    work = tmp_path / "work"
    work.mkdir()
    out = run([str(exe), str(DRIVER), stack.url + "/v1", "script-8", str(work)], work, {"HOME": str(tmp_path), "PYTHONPATH": ""},
              timeout=300)
    assert "ANSWER: Done: 8 steps." in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    verdict = stack.check(min_results=8, api="/v1/chat/completions")
    assert len(verdict["sessions"]) == 1, f"one run, one session: {verdict['sessions']}"  # 25 sessions for 25 requests before
    forwarded = [f["body"]["messages"] for f in httpx.get(stack.fake + "/_requests").json()]
    assert not any(m.get("role") == "tool" or m.get("tool_calls") for msgs in forwarded for m in msgs)  # smolagents' own form
