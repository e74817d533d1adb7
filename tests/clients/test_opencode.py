"""opencode (npm ``opencode-ai`` in .clients/opencode, pinned in scripts/install-clients.sh),
``opencode run`` through the proxy's ``/v1/chat/completions``: a provider of its own
(``@ai-sdk/openai-compatible``, bundled in the binary) whose ``baseURL`` is the proxy, and its
``bash`` tool runs eight shell steps of about 450 tokens of output, then its answer. Offline: home
and XDG directories in tmp, no models.dev fetch, no update check, no LSP download, no share, and
npm offline at an unreachable registry (opencode installs ``@opencode-ai/plugin`` into its config
directory in the background at each start; that install fails, and opencode only logs it)."""

from __future__ import annotations

import json

import httpx

from harness import CLIENTS, need, run, within_budget

OPENCODE = CLIENTS / "opencode" / "node_modules" / ".bin" / "opencode"
OFFLINE = {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
           "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1",
           "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1", "npm_config_offline": "true", "npm_config_registry": "http://127.0.0.1:9/"}


def config(base_url: str, model: str) -> dict:
    """An opencode.json with one OpenAI-compatible provider ``hg`` at ``base_url``, offering ``model``."""
    return {"$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled", "model": f"hg/{model}",
            "provider": {"hg": {"npm": "@ai-sdk/openai-compatible", "name": "historygraph",
                                "options": {"baseURL": base_url, "apiKey": "sk-dummy"},
                                "models": {model: {"name": model, "tool_call": True}}}},
            "permission": {"bash": "allow", "edit": "allow", "external_directory": "allow"}}


def test_opencode_run_does_eight_shell_steps_in_one_session(stack, tmp_path):
    exe = need(OPENCODE, "opencode")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (tmp_path / "opencode.json").write_text(json.dumps(config(stack.url + "/v1", "script-8")))
    xdg = {f"XDG_{k}_HOME": str(home / d) for k, d in [("CONFIG", ".config"), ("DATA", ".local/share"), ("CACHE", ".cache"),
                                                       ("STATE", ".local/state")]}
    env = {"HOME": str(home), **xdg, **OFFLINE, "OPENCODE_CONFIG": str(tmp_path / "opencode.json")}
    # --title: no separate title request (that would be a second conversation)
    out = run([str(exe), "run", "--title", "steps", "-m", "hg/script-8", "Run the numbered steps."], work, env, timeout=240)
    assert "Done: 8 steps." in out.stdout, (out.stdout + out.stderr)[-3000:]
    verdict = stack.check(min_results=8, api="/v1/chat/completions")
    assert len(verdict["sessions"]) == 1, verdict["sessions"]
    forwarded = httpx.get(stack.fake + "/_requests").json()
    assert len(forwarded) == 9  # eight steps and the answer, nothing else
    assert {f["headers"].get("authorization") for f in forwarded} == {"Bearer sk-dummy"}  # the provider's apiKey goes on
    within_budget(stack, verdict["sessions"])
