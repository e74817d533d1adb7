"""mini-swe-agent's own CLI (``mini``, from the test extra) through the proxy's
``/v1/chat/completions`` via LiteLLM: six real shell steps of about 450 tokens of output in a
temporary folder, then its submit command, in tool-call mode (``mini.yaml``), text mode
(``mini_textbased.yaml``, actions in ``mswea_bash_command`` blocks) and Responses mode
(``litellm_response``, ``POST /v1/responses``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from harness import need, run

MODES = {"tool": ("mini.yaml", "litellm"), "text": ("mini_textbased.yaml", "litellm_textbased"),
         "responses": ("mini.yaml", "litellm_response")}


@pytest.mark.parametrize("mode", list(MODES))
def test_mini_swe_agent_runs_six_steps_and_submits(stack, tmp_path, mode):
    mini = need(Path(sys.executable).parent / "mini", "mini-swe-agent (the test extra)")
    config, model_class = MODES[mode]
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {"HOME": str(home), "MSWEA_CONFIGURED": "true", "OPENAI_API_KEY": "sk-dummy", "MSWEA_COST_TRACKING": "ignore_errors",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    cmd = [str(mini), "-y", "--exit-immediately", "-l", "0", "-m", "openai/script-6", "-t", "Run the numbered steps, then submit.",
           "--model-class", model_class, "-c", config, "-c", f"model.model_kwargs.api_base={stack.url}/v1",
           "-c", "model.model_kwargs.api_key=sk-dummy", "-c", "agent.step_limit=20", "-o", str(tmp_path / "traj.json")]
    api = "/v1/responses" if mode == "responses" else "/v1/chat/completions"
    run(cmd, work, env, timeout=300)
    traj = (tmp_path / "traj.json").read_text()
    assert '"exit_status": "Submitted"' in traj, traj[-2000:]
    stack.check(min_results=6, api=api)
    assert shutil.which("bash")
