"""The agent-neutral facts of a result measured for the learned selector (issue 48,
``bench/agent_facts.py``): the call kind from Claude Code's and Codex CLI's tool names and shell
commands, the kind read from a shell output's shape, the error flag of their exit codes; and
``historygraph fit`` on a copy of a user's ``~/.claude/projects`` with its held-out check."""

import gzip
import json
import re
import shutil

import sys
from pathlib import Path

import pytest

from historygraph.history.events import Message, ToolCall

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from agent_facts import call_kind, extract_facts, has_error, output_kind  # noqa: E402


@pytest.mark.parametrize("name, args, kind", [
    ("Read", {"file_path": "/r/cli/setup.go"}, "view"),
    ("Grep", {"pattern": "settings", "path": "/r/cli", "output_mode": "content"}, "search"),
    ("Glob", {"pattern": "**/*.go"}, "search"),
    ("Edit", {"file_path": "/r/a.go", "old_string": "python x", "new_string": "y"}, "edit"),  # not 'run' for its text
    ("Write", {"file_path": "/r/a.md", "content": "# x"}, "edit"),
    ("Bash", {"command": "cd /r && sed -n '1,40p' a.go"}, "view"),   # the cd step left out
    ("Bash", {"command": "mise run test 2>&1"}, "test"),
    ("Bash", {"command": "go test ./..."}, "test"),
    ("exec_command", {"cmd": "sed -n '1,120p' .git/hooks/prepare-commit-msg", "workdir": "/r"}, "view"),
    ("shell", {"command": ["bash", "-lc", "rg -n foo src"]}, "search"),
    ("exec_command", {"cmd": "git diff HEAD~1"}, "view"),
    ("apply_patch", {"input": "*** Begin Patch\n*** Update File: a.ts\n"}, "edit"),
    ("TodoWrite", {"todos": []}, "other"),
    ("bash", {"command": "cd /testbed && grep -rn foo ."}, "search"),
])
def test_call_kind_of_other_agents(name, args, kind):
    assert call_kind(name, json.dumps(args)) == kind


CODEX_HEAD = "Chunk ID: a696c4\nWall time: 0.6 seconds\nProcess exited with code {}\nOriginal token count: 9\nOutput:\n"


@pytest.mark.parametrize("text, kind", [
    ("     1→package cli\n     2→\n     3→import (\n     4→\t\"fmt\"\n", "view"),   # Claude Code's Read
    (CODEX_HEAD.format(0) + "ok  \tgithub.com/x/cli\t11.363s\nok  \tgithub.com/x/cli/agent\t(cached)\n", "test"),
    (CODEX_HEAD.format(0) + "src/a.ts:12:const x = 1\nsrc/b.ts:40:export x\n", "search"),
    (CODEX_HEAD.format(0) + "diff --git a/a b/a\n--- a/a\n+++ b/a\n@@ -1 +1 @@\n-x\n+y\n", "edit"),
    (CODEX_HEAD.format(0) + "## main...origin/main [ahead 1]\n?? examples/x.json\nM  src/a.ts extra words\n", "run"),
    (CODEX_HEAD.format(0), "other"),   # the header alone says nothing
    ("func main() {\n\tfmt.Println(1)\n}\n", "view"),
])
def test_output_kind_reads_the_shape_under_an_agents_wrapper(text, kind):
    assert output_kind(text) == kind


def test_a_shell_command_of_no_known_kind_takes_its_outputs_shape():
    call = ToolCall("c1", "exec_command", json.dumps({"cmd": "jq .items data.json | cut -c1-80"}))
    assert call_kind(call.name, call.arguments) == "other"
    listing = "\n".join(f"{i:6}→line {i}" for i in range(1, 6))
    assert extract_facts(Message("tool", listing, tool_call_id="c1"), call)[0] == "view"
    todo = ToolCall("c2", "TodoWrite", "{}")  # not a shell: its kind stays the name's
    assert extract_facts(Message("tool", listing, tool_call_id="c2"), todo)[0] == "other"


def test_exit_codes_and_tool_errors_are_errors():
    assert has_error(CODEX_HEAD.format(1)) and has_error(CODEX_HEAD.format(2))
    assert not has_error(CODEX_HEAD.format(0)) and not has_error("Exit code: 0\nWall time: 0 seconds\nOutput:\n")
    assert has_error("Exit code: 1\nOutput:\n") and has_error("[The command completed with exit code 1.]")
    assert has_error("<tool_use_error>File has not been read yet.</tool_use_error>")


def test_codex_exit_codes_on_real_sessions_match_the_error_flag(sessions_dir):
    """On real Codex CLI sessions, a result whose header reports a non-zero exit code is an error;
    one that reports 0 and contains none of the other error patterns is not."""
    from historygraph.traces import read_traces

    seen = {0: 0, 1: 0}
    for f in sorted((sessions_dir / "codex").glob("*.jsonl.gz"))[:3]:
        for tr in read_traces(f):
            for m in tr.messages:
                code = re.search(r"^Process exited with code (\d+)$", m.content[:300], re.M) if m.role == "tool" else None
                if code is None:
                    continue
                failed = int(code.group(1)) != 0
                seen[int(failed)] += 1
                if failed:
                    assert has_error(m.content[:8000])
                elif not re.search(r"Traceback|Error\b|FAILED|error:|<tool_use_error>", m.content[:8000]):
                    assert not has_error(m.content[:8000])
    assert seen[0] > 10 and seen[1] > 0


def test_fit_on_a_copy_of_claude_projects_reports_the_held_out_change(tmp_path, sessions_dir):
    """``historygraph fit ~/.claude/projects`` (a copy of four small real sessions in the folder
    layout Claude Code writes, uncompressed) holds out every 4th session, says how recall at 32000
    and 16000 tokens moved there, and writes a model fitted on all four."""
    from typer.testing import CliRunner

    from historygraph.cli import app
    from historygraph.eval.recall import reuse_events
    from historygraph.policies.learned.model import ReuseModel
    from historygraph.traces import read_traces

    project = tmp_path / ".claude" / "projects" / "-Users-dev-Repositories-cli"
    project.mkdir(parents=True)
    small = sorted((sessions_dir / "claude-code").glob("*.jsonl.gz"), key=lambda p: p.stat().st_size)[:4]
    for f in small:
        with gzip.open(f, "rb") as src, open(project / f.name.removesuffix(".gz").split("__")[-1], "wb") as dst:
            shutil.copyfileobj(src, dst)
    out = tmp_path / "model.json"
    res = CliRunner().invoke(app, ["fit", str(tmp_path / ".claude" / "projects"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    held = sorted(project.iterdir())[3]  # every 4th in file order
    events = sum(1 for _ in reuse_events(next(iter(read_traces(held))).messages))
    for b in (32000, 16000):
        assert f"held out 1 of 4 traces (every 4th), fitted on the other 3: recall at B = {b}:" in text
        assert f"{events} reuse events" in text
    meta = ReuseModel.load(out).meta
    assert meta["traces"] == 4 and meta["held_out"]["held_out"] == 1
    assert {int(b) for b in meta["held_out"]["budgets"]} == {32000, 16000}
    plain = tmp_path / "plain.json"  # --no-check: the fit alone (the documented re-creation of the shipped file)
    res = CliRunner().invoke(app, ["fit", str(tmp_path / ".claude" / "projects"), "--out", str(plain), "--no-check"])
    assert res.exit_code == 0 and "held out" not in res.output and "held_out" not in ReuseModel.load(plain).meta


def test_loao_table_gives_recall_and_share_of_the_bound():
    """``bench/fit_loao.py --table``: recall % (hits) of the held-out model and the shipped one, the
    exact bound, and each as a share of the bound; the agent's own ``recorded`` row is left out."""
    from fit_loao import table

    base = {"codex": {"shipped 32000": [30, 40, 0, 1], "oracle 32000": [36, 40, 0, 1]}}
    loao = {"codex": {"loao 32000": [27, 40, 0, 1], "recorded 32000": [40, 40, 0, 1]}}
    rows = table(base, loao).splitlines()
    assert rows[2:] == ["| codex | 32000 | 40 | 67.5 (27) | 75.0 (30) | 90.0 | 75 % | 83 % |"]
