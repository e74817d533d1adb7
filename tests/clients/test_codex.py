"""The Codex CLI (npm ``@openai/codex``, pinned in scripts/install-clients.sh), ``codex exec``
through the proxy's ``POST /v1/responses`` (a model provider whose ``base_url`` is the proxy):
six shell steps of about 450 tokens of output, then its answer."""

from __future__ import annotations

from harness import CLIENTS, need, run

CODEX = CLIENTS / "npm" / "node_modules" / ".bin" / "codex"


def test_codex_exec_runs_six_shell_steps(stack, tmp_path):
    exe = need(CODEX, "the Codex CLI")
    home = tmp_path / "codex-home"
    home.mkdir()
    provider = f'{{name="historygraph", base_url="{stack.url}/v1", env_key="OPENAI_API_KEY", wire_api="responses"}}'
    env = {"CODEX_HOME": str(home), "HOME": str(tmp_path), "OPENAI_API_KEY": "sk-dummy"}
    out = run([str(exe), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "-m", "script-6",
               "-c", "model_provider=historygraph", "-c", f"model_providers.historygraph={provider}",
               "Run the numbered steps."], tmp_path, env, timeout=240)
    assert "Done: 6 steps." in out.stdout + out.stderr, (out.stdout + out.stderr)[-3000:]
    stack.check(min_results=6, api="/v1/responses")
