"""Claude Code (npm ``@anthropic-ai/claude-code``, pinned in scripts/install-clients.sh) in print
mode through the proxy's ``/v1/messages``: six Bash steps of about 450 tokens of output each, and a
run that first loads a deferred tool (``ToolSearch`` with ``select:CronList``, then ``CronList``)."""

from __future__ import annotations

from harness import CLIENTS, need, run

CLAUDE = CLIENTS / "npm" / "node_modules" / ".bin" / "claude"


def claude(stack, tmp_path, model: str, tools: str):
    exe = need(CLAUDE, "Claude Code")
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "ANTHROPIC_BASE_URL": stack.url, "ANTHROPIC_API_KEY": "sk-ant-dummy", "ANTHROPIC_SMALL_FAST_MODEL": model,
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}
    out = run([str(exe), "-p", "Run the numbered steps, then say done.", "--model", model, "--allowedTools", *tools.split()],
              tmp_path, env, timeout=240)
    assert "Done:" in out.stdout, out.stdout[-2000:]
    return stack.check(min_results=5, api="/v1/messages")


def test_claude_code_print_mode_runs_six_bash_steps(stack, tmp_path):
    claude(stack, tmp_path, "script-6", "Bash")


def test_claude_code_loads_a_deferred_tool_and_goes_on(stack, tmp_path):
    got = claude(stack, tmp_path, "script-6-load", "Bash ToolSearch CronList")
    assert any(t["path"].startswith("/v1/messages") for t in got["tapped"])
