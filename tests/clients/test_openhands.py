"""The OpenHands SDK (``openhands-sdk`` with ``openhands-tools``, in .clients/openhands, Python
3.12) through the proxy's ``/v1/chat/completions`` via LiteLLM: an agent with its terminal tool
runs six shell steps of about 450 tokens of output (tests/clients/openhands_driver.py)."""

from __future__ import annotations

from pathlib import Path

from harness import CLIENTS, need, run

PYTHON = CLIENTS / "openhands" / "bin" / "python"
DRIVER = Path(__file__).resolve().parent / "openhands_driver.py"


def test_openhands_agent_runs_six_terminal_steps(stack, tmp_path):
    exe = need(PYTHON, "the OpenHands SDK")
    tools = next((CLIENTS / "openhands" / "lib").glob("python3*/site-packages/openhands/tools"), CLIENTS / "openhands" / "openhands-tools")
    need(tools, "openhands-tools")
    work = tmp_path / "work"
    work.mkdir()
    env = {"HOME": str(tmp_path), "OPENHANDS_SUPPRESS_BANNER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": ""}
    out = run([str(exe), str(DRIVER), stack.url + "/v1", "script-6", str(work)], work, env, timeout=300)
    assert "FINISHED:" in out.stdout, out.stdout[-3000:]
    stack.check(min_results=6, api="/v1/chat/completions")
