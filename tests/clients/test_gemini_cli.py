"""Gemini CLI (npm ``@google/gemini-cli``, pinned in scripts/install-clients.sh), ``gemini -p``
through the proxy's Gemini API (``GOOGLE_GEMINI_BASE_URL`` at the proxy, an API key of its own):
one tool-using turn (the fake calls ``list_directory``, then answers in text), and six shell steps
of about 450 tokens of output (``run_shell_command``, the scripted model), then its answer."""

from __future__ import annotations

import json

import httpx

from harness import CLIENTS, need, run

GEMINI = CLIENTS / "npm" / "node_modules" / ".bin" / "gemini"
SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True}, "telemetry": {"enabled": False}}


def gemini(stack, tmp_path, model: str, prompt: str):
    """``gemini -m MODEL -p PROMPT`` in a fresh home and work directory (holding one file), at the stack."""
    exe = need(GEMINI, "Gemini CLI")
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS))  # offline: no telemetry, no update check
    work.mkdir()
    (work / "notes-for-gemini.txt").write_text("hello\n")
    env = {"HOME": str(home), "GEMINI_API_KEY": "fake-gemini-key", "GOOGLE_GEMINI_BASE_URL": stack.url,
           "GEMINI_CLI_TRUST_WORKSPACE": "true"}
    return run([str(exe), "-m", model, "--approval-mode", "yolo", "-p", prompt], work, env, timeout=240)


def test_gemini_cli_lists_a_directory_through_the_proxy(stack, tmp_path):
    out = gemini(stack, tmp_path, "gemini-2.5-flash", "List the files here.")
    assert "answer" in out.stdout, (out.stdout + out.stderr)[-3000:]
    assert httpx.get(stack.fake + "/_rejections").json() == []
    tapped = httpx.get(stack.url + "/_tap").json()
    assert [t for t in tapped if t["status"] >= 400] == [] and all(t["path"].startswith("/v1beta/models/") for t in tapped)
    forwarded = [f for f in httpx.get(stack.fake + "/_requests").json() if f["path"].startswith("/v1beta/")]
    assert len(forwarded) >= 2 and all(f["headers"]["x-goog-api-key"] == "fake-gemini-key" for f in forwarded)
    # the call and its result, paired in the request after it; the result lists the file
    last = forwarded[-1]["body"]["contents"]
    calls = [p["functionCall"] for c in last for p in c["parts"] if "functionCall" in p]
    results = [p["functionResponse"] for c in last for p in c["parts"] if "functionResponse" in p]
    assert [c["name"] for c in calls] == [r["name"] for r in results] == ["list_directory"]
    assert "notes-for-gemini.txt" in json.dumps(results[0]["response"])
    # one session: the CLI's echo of each answer (its own call ids, no thought parts) continues it
    grown = {s: n for s, n in stack.sessions().items() if n > stack._before.get(s, 0)}
    assert len(grown) == 1, grown


def test_gemini_cli_runs_six_shell_steps(stack, tmp_path):
    out = gemini(stack, tmp_path, "script-6", "Run the numbered steps.")
    assert "Done: 6 steps." in out.stdout, (out.stdout + out.stderr)[-3000:]
    verdict = stack.check(min_results=6)  # over B = 3000 at the end, every newest result complete
    assert len(verdict["sessions"]) == 1, verdict["sessions"]
