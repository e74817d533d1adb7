"""Simon Willison's ``llm`` CLI (pip ``llm`` in .clients/llm, pinned in scripts/install-clients.sh)
through the proxy's ``/v1/chat/completions``: an OpenAI-compatible model of its own
(``extra-openai-models.yaml`` in ``LLM_USER_PATH``: ``api_base`` the proxy, ``api_key_name: openai``
(else llm sends ``DUMMY_KEY``), ``supports_tools``)
and a ``bash`` tool given with ``--functions`` (a Python file) run eight shell steps of about 450
tokens of output in one tool chain, then its answer. Offline: ``LLM_USER_PATH`` and home in tmp,
no plugins installed; llm checks for no updates."""

from __future__ import annotations

import httpx

from harness import CLIENTS, need, run, within_budget

LLM = CLIENTS / "llm" / "bin" / "llm"
TOOLS = '''def bash(command: str) -> str:
    "Run a shell command with bash and return its output."
    import subprocess
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True).stdout
'''


def test_llm_tool_chain_does_eight_shell_steps_in_one_session(stack, tmp_path):
    exe = need(LLM, "llm")
    user, work = tmp_path / "llm-user", tmp_path / "work"
    user.mkdir()
    work.mkdir()
    (user / "extra-openai-models.yaml").write_text(f'- model_id: hg-script-8\n  model_name: script-8\n  api_base: "{stack.url}/v1"\n'
                                                  "  api_key_name: openai\n  supports_tools: true\n")
    (tmp_path / "tools.py").write_text(TOOLS)
    env = {"HOME": str(tmp_path), "LLM_USER_PATH": str(user), "OPENAI_API_KEY": "sk-dummy"}
    out = run([str(exe), "-m", "hg-script-8", "--functions", str(tmp_path / "tools.py"), "--chain-limit", "12",
               "Run the numbered steps."], work, env, timeout=240)
    assert "Done: 8 steps." in out.stdout, (out.stdout + out.stderr)[-3000:]
    verdict = stack.check(min_results=8, api="/v1/chat/completions")
    assert len(verdict["sessions"]) == 1, verdict["sessions"]
    forwarded = httpx.get(stack.fake + "/_requests").json()
    assert len(forwarded) == 9  # eight steps and the answer, nothing else
    assert {f["headers"].get("authorization") for f in forwarded} == {"Bearer sk-dummy"}  # api_key_name: the key goes on
    within_budget(stack, verdict["sessions"])
