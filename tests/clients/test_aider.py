"""aider (pip ``aider-chat`` in .clients/aider, pinned in scripts/install-clients.sh) through the
proxy's ``/v1/chat/completions``: one ``--message`` that edits ``notes.txt`` with SEARCH/REPLACE
blocks (``v<k-1>`` to ``v<k>``), and a failing ``--test-cmd`` (about 550 tokens of output naming
the file's version) that aider sends back three times for a fix: four edits in all, each made
from the newest test output and the file as aider last showed it."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from fake_scripts import expected_output
from harness import CLIENTS, need, run

AIDER = CLIENTS / "aider" / "bin" / "aider"
TEST_CMD = "bash -c 'k=$(tr -dc 0-9 < notes.txt); echo STEP-$k; seq -s \" \" $((k*10000)) $((k*10000+180)); exit 1'"
FILES = "I have *added these files to the chat*"  # aider's message that shows the files as they are now


def test_aider_edits_and_answers_each_test_failure(stack, tmp_path):
    exe = need(AIDER, "aider")
    (tmp_path / "notes.txt").write_text("v0\n")
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "OPENAI_API_KEY": "sk-dummy", "AIDER_ANALYTICS": "false", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = run([str(exe), "--model", "openai/script-4", "--openai-api-base", stack.url + "/v1", "--openai-api-key", "sk-dummy",
               "--message", "Bump the version in notes.txt until the test passes.", "--yes-always", "--no-git", "--edit-format", "diff",
               "--auto-test", "--test-cmd", TEST_CMD, "--no-check-update", "--no-show-model-warnings", "--no-analytics", "--no-pretty",
               "--no-fancy-input", "--no-show-release-notes", "notes.txt"], tmp_path, env, timeout=300)
    forwarded = [f["body"]["messages"] for f in httpx.get(stack.fake + "/_requests").json() if "SEARCH/REPLACE" in json_text(f["body"])]
    blinded = [n for n, msgs in enumerate(forwarded) if any(FILES in json_text(m) for m in sent_for(stack, n))
               and not any(FILES in json_text(m) for m in msgs)]
    if (tmp_path / "notes.txt").read_text() != "v4\n" and blinded:
        pytest.xfail(f"proxy bug (issue 36 item 5): at B = {stack.budget} the forwarded edit request {blinded[0] + 1} replaced aider's "
                     "current context (its message showing notes.txt as it is now, and the model's own last edit) with "
                     "an '[omitted: messages #2–#N …]' placeholder, so the model edited a version of the file it could not see "
                     "(SearchReplaceNoExactMatch)")
    assert (tmp_path / "notes.txt").read_text() == "v4\n", out.stdout[-3000:]
    for n, msgs in enumerate(forwarded):  # the newest test output aider sent, complete in every edit request
        last = json_text(msgs[-1])
        for k in {int(k) for k in re.findall(r"STEP-(\d+)\\n", last)}:
            assert expected_output(k).split("\n")[1] in last, f"edit request {n + 1}: the output of test run {k} is not complete"
    stack.check(min_results=0, api="/v1/chat/completions", over_b=False)


def json_text(value) -> str:
    return json.dumps(value)


def sent_for(stack, n: int) -> list[dict]:
    """The messages of aider's ``n``-th edit request as aider sent it (before the proxy)."""
    sent = [t["request"]["messages"] for t in httpx.get(stack.url + "/_tap").json()
            if t.get("request") and "SEARCH/REPLACE" in json_text(t["request"])]
    return sent[n] if n < len(sent) else []
