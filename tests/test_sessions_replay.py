"""``historygraph replay`` on the session logs people have, laid out as Claude Code and the Codex CLI
keep them (``~/.claude/projects/<project>/<session>.jsonl``, ``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl.gz``),
with no flag but the policies: detected, replayed at 16k/32k/64k, the ``recorded`` row and the user's
own answer per project; and a round trip that re-renders every call of a real session under every
policy with the invariants checked."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from historygraph.cli import app
from historygraph.eval.recorded import RECORDED
from historygraph.eval.replay import replay_trace
from historygraph.policies import Signals, create
from historygraph.policies import names as policy_names
from historygraph.traces import read_traces

from doubles import ScriptedModel, TableScorer

runner = CliRunner()
CLAUDE = "entireio__cli__a1d04b39-c7d2-47c4-aec6-d0118b0f71c6.jsonl.gz"  # 99 tool results, no compaction
CODEX = "EntityProcess__agentv__019ed836-b1da-78f1-8a0c-e598363d10f4.jsonl.gz"  # 21 tool results


def home_layout(sessions_dir: Path, root: Path) -> Path:
    """A home folder with one Claude Code session (uncompressed, as Claude Code writes it) and one
    Codex rollout (compressed), where those agents put them."""
    project = root / ".claude" / "projects" / "-Users-dip-Repositories-cli"
    project.mkdir(parents=True)
    with gzip.open(sessions_dir / "claude-code" / CLAUDE, "rb") as src, open(project / "a1d04b39.jsonl", "wb") as dst:
        shutil.copyfileobj(src, dst)
    day = root / ".codex" / "sessions" / "2026" / "06" / "18"
    day.mkdir(parents=True)
    shutil.copy(sessions_dir / "codex" / CODEX, day / "rollout-2026-06-18T00-52-03-019ed836.jsonl.gz")
    return root


@pytest.mark.slow
def test_replay_of_the_agents_folders_needs_no_flag(sessions_dir: Path, tmp_path: Path, monkeypatch) -> None:
    home = home_layout(sessions_dir, tmp_path / "home")
    out = tmp_path / "out"
    for folder in (home / ".claude" / "projects", home / ".codex" / "sessions"):
        res = runner.invoke(app, ["replay", str(folder), "-p", "prune", "-p", "full", "--store", ":memory:", "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert "at B = 16000, 32000, 64000 tokens" in res.output
        assert "Your sessions: what you paid" in res.output and "recorded" in res.output
        assert "cache check" in res.output
        # the Claude session wrote all its cache (105,581 tokens, read from its usage lines) with the
        # 1-hour TTL and is simulated with it; the Codex one has no such writes
        ttl = "cache TTL: the session wrote the prompt cache with the 1-hour TTL, so anthropic-style is simulated with 1 hour"
        assert (ttl in " ".join(res.output.split())) == (folder.parent.name == ".claude")
        if folder.parent.name == ".claude":
            assert runner.invoke(app, ["report", str(out)]).exit_code == 0
            assert "Cache TTL: the session wrote the prompt cache with the 1-hour TTL" in (out / "report.md").read_text()
    data = json.loads((out / "replay.json").read_text())
    assert data["meta"]["budgets"] == [16000, 32000, 64000]
    rows = [r for r in data["per_source"] if r["policy"] == RECORDED]
    assert {r["source"] for r in rows} == {"codex", "ALL"}
    assert all(r["recorded_bill_usd"] > 0 and r["bill_vs_recorded"] > 0 for r in rows)
    projects = {r["project"] for r in data["per_project"]}
    assert projects == {"EntityProcess/agentv", "ALL"}
    # the report opens with the user's own sessions and recommends against the agent's own context
    # management, not against Full history (which the agent never paid for); the figure of recall
    # against the bill draws the agent's own beside the policies
    from historygraph.eval import plots
    drawn: list[list[str]] = []
    figure = plots.recall_vs_cache_cost
    monkeypatch.setattr(plots, "recall_vs_cache_cost", lambda rows, p, *a: drawn.append(list(p)) or figure(rows, p, *a))
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    assert drawn == [["prune", "full", RECORDED]]
    md = (out / "report.md").read_text()
    assert md.index("## Your sessions") < md.index("Recommended instead of your agent's own context management")
    assert "## Recommended policy" not in md and "Cache TTL" not in md
    assert "| EntityProcess/agentv | 1 | 11 |" in md  # one session of 11 model calls


def test_both_agents_in_one_replay_are_grouped_by_project(sessions_dir: Path, tmp_path: Path) -> None:
    home = home_layout(sessions_dir, tmp_path / "home")
    out = tmp_path / "out"
    res = runner.invoke(app, ["replay", str(home / ".claude"), str(home / ".codex"), "-p", "full", "--budget", "32000",
                              "--store", ":memory:", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "replay.json").read_text())
    by = {(r["project"], r["policy"]): r for r in data["per_project"]}
    # the Claude Code session ran in /Users/dip/Repositories/cli; Full history keeps every reuse
    assert by[("Repositories/cli", "full")]["recall"] == 100.0
    assert by[("ALL", RECORDED)]["sessions"] == 2
    assert by[("ALL", RECORDED)]["paid_usd"] == pytest.approx(by[("Repositories/cli", RECORDED)]["paid_usd"]
                                                             + by[("EntityProcess/agentv", RECORDED)]["paid_usd"], abs=1e-3)
    assert set(data["cache_check"]) == {"claude-code (anthropic-style)", "codex (openai-style)", "ALL"}


@pytest.mark.lm
@pytest.mark.slow
def test_every_call_of_a_real_session_under_every_policy_keeps_the_invariants(sessions_dir: Path) -> None:
    """Round trip: each recorded call of a real Codex session re-rendered by every registered policy
    (the clairvoyant bounds included; summarising and attention-scoring policies with deterministic
    test doubles for their local models, as tests/test_invariants.py) at B = 16000, the invariants
    checked on each rendering."""
    (trace,) = read_traces(sessions_dir / "codex" / CODEX)
    sig = Signals(model_factory=ScriptedModel, scorer_factory=TableScorer)
    names = policy_names(replay=True)
    res = replay_trace(trace, {n: create(n, replay=True) for n in names}, 16_000, sig)
    for n in names:
        st = res.stats[n]
        assert st.violations == [], (n, st.violations[:2])
        assert len(st.history_tokens) + st.budget_errors == res.invocations
        assert all(t <= 16_000 for t in st.history_tokens) or n == "full"
    assert res.stats["full"].hits == res.stats["full"].events > 0


def test_a_replay_of_other_traces_into_the_same_folder_says_it_replaced_the_earlier_one(sessions_dir: Path, tmp_path: Path) -> None:
    home = home_layout(sessions_dir, tmp_path / "home")
    out = tmp_path / "out"
    args = ["-p", "full", "--budget", "32000", "--store", ":memory:", "--out", str(out)]
    first = runner.invoke(app, ["replay", str(home / ".codex" / "sessions"), *args])
    assert first.exit_code == 0 and "replaced the earlier replay" not in first.output
    second = runner.invoke(app, ["replay", str(home / ".claude" / "projects"), *args])
    assert second.exit_code == 0 and f"replaced the earlier replay in {out} (of {home / '.codex' / 'sessions'})" in " ".join(second.output.split())
