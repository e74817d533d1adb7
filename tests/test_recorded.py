"""The ``recorded`` row (the agent's own context management) and the recorded bill, by hand.

A small session with one compaction: the figures below are worked out from the messages and the
usage written here, not from the code."""

from __future__ import annotations

import pytest

from historygraph.eval.prices import default_price_models
from historygraph.eval.recorded import RECORDED, fixed_tokens, home_price_model, recorded_bill, recorded_context
from historygraph.eval.replay import replay_trace
from historygraph.eval.report import summarize
from historygraph.history.events import Message, ToolCall, Trace
from historygraph.policies import Signals, create


def call(i: str, path: str) -> ToolCall:
    return ToolCall(i, "Read", f'{{"file_path": "{path}"}}')


def session() -> Trace:
    msgs = [
        Message("user", "fix the parser"),                                            # 0
        Message("assistant", "reading", (call("c1", "a.go"),)),                        # 1  call 1
        Message("tool", "func Parse_Alpha() {}", tool_call_id="c1"),                   # 2  first seen: Parse_Alpha
        Message("assistant", "reading more", (call("c2", "b.go"),)),                   # 3  call 2
        Message("tool", "func Parse_Bravo() {}", tool_call_id="c2"),                   # 4  first seen: Parse_Bravo
        Message("user", "go on"),                                                      # 5  (after the compaction)
        Message("assistant", "edit Parse_Alpha and Parse_Bravo", (call("c3", "c.go"),)),  # 6  call 3: reuses 2 and 4
        Message("tool", "func Parse_Charlie() {}", tool_call_id="c3"),                 # 7
        Message("assistant", "done with Parse_Charlie"),                               # 8  call 4: reuses 7
    ]
    usage = [  # tokens as an Anthropic bill gives them
        {"message": 1, "input": 10, "cache_read": 0, "cache_write": 2000, "cache_write_1h": 0, "output": 50, "model": "claude-opus-4-6"},
        {"message": 3, "input": 10, "cache_read": 2000, "cache_write": 100, "cache_write_1h": 0, "output": 40, "model": "claude-opus-4-6"},
        {"message": 6, "input": 10, "cache_read": 0, "cache_write": 1500, "cache_write_1h": 1000, "output": 60, "model": "claude-opus-4-6"},
        {"message": 8, "input": 10, "cache_read": 1500, "cache_write": 100, "cache_write_1h": 0, "output": 30, "model": "claude-opus-4-6"},
    ]
    compaction = {"at": 5, "kept": [{"role": "user", "content": "Summary: reading a.go and b.go"}], "trigger": "auto",
                  "pre_tokens": 3000, "timestamp": None}
    return Trace("claude-code", "s1", "s1.jsonl", msgs,
                 {"model": "claude-opus-4-6", "usage": usage, "compactions": [compaction]})


def test_recorded_context_is_the_summary_then_what_followed() -> None:
    t = session()
    assert recorded_context(t, 3) == t.messages[:3]
    summary = Message("user", "Summary: reading a.go and b.go")
    assert recorded_context(t, 6) == [summary, t.messages[5]]
    assert recorded_context(t, 8) == [summary, *t.messages[5:8]]


def test_recorded_row_recall_tokens_and_bill_by_hand() -> None:
    t = session()
    sig = Signals()
    res = replay_trace(t, {"full": create("full", replay=True)}, 100_000, sig)
    rec, full = res.stats[RECORDED], res.stats["full"]
    # events: (6, 2), (6, 4) and (8, 7); the compaction left 2 and 4 out at call 6, 7 is shown at 8
    assert (rec.events, rec.hits) == (3, 1)
    assert (full.events, full.hits) == (3, 3)
    c = sig.counter
    summary = Message("user", "Summary: reading a.go and b.go")
    m = t.messages
    # history tokens as a rendering counts them: without the current (latest) user message
    assert rec.history_tokens == [0, c.count_messages(m[1:3]), c.count_messages([summary]),
                                  c.count_messages([summary, m[6], m[7]])]
    assert rec.input_tokens == [c.count_messages(m[:1]), c.count_messages(m[:3]), c.count_messages([summary, m[5]]),
                                c.count_messages([summary, m[5], m[6], m[7]])]
    # Anthropic-style prices (USD per million): input 3, 5-minute write 3.75, 1-hour write 2 x 3 = 6, read 0.3, output 15
    paid = (40 * 3 + 3500 * 0.3 + (2000 + 100 + 500 + 100) * 3.75 + 1000 * 6 + 180 * 15) / 1e6
    assert home_price_model(t) == "anthropic-style"
    assert recorded_bill(t, default_price_models()["anthropic-style"]) == pytest.approx(paid)
    # the replay prices every row's output, the recorded one's too, as the assistant messages counted
    # (Claude Code logs keep a partial output_tokens)
    paid += (c.count_messages([m[1], m[3], m[6], m[8]]) - 180) * 15 / 1e6
    # the system prompt and tools: the first call's 2010 billed input tokens minus the task before it
    assert fixed_tokens(t, c) == 2010 - c.count_messages(m[:1])
    per_trace, per_source = summarize([res])
    rows = {r["policy"]: r for r in per_source if r["source"] == "claude-code"}
    traces = {r["policy"]: r for r in per_trace}
    assert rows[RECORDED]["recorded_bill_usd"] == pytest.approx(paid, abs=1e-6)
    for name in ("full", RECORDED):  # the simulated bill with Anthropic's cache over what was paid
        assert traces[name]["cost_cache_usd_anthropic-style"] > 0
        assert rows[name]["bill_vs_recorded"] == pytest.approx(traces[name]["cost_cache_usd_anthropic-style"] / paid, rel=1e-3)
    assert rows[RECORDED]["recall"] == pytest.approx(100 / 3, abs=1e-3)


def test_a_trace_without_recorded_usage_has_no_recorded_row() -> None:
    t = session()
    t.meta = {}
    res = replay_trace(t, {"full": create("full", replay=True)}, 100_000, Signals())
    assert RECORDED not in res.stats and res.recorded is None


def test_cache_check_by_hand() -> None:
    from historygraph.eval.prompt_cache import CacheTokens
    from historygraph.eval.recorded import CacheCall, cache_check

    calls = [CacheCall(1, CacheTokens(0, 1000, 0), CacheTokens(0, 900, 100)),       # read share: simulated 0, recorded 0
             CacheCall(3, CacheTokens(900, 100, 0), CacheTokens(800, 0, 0, 200)),   # 90 % against 80 %: 10 points
             CacheCall(5, CacheTokens(1000, 0, 0), CacheTokens(1000, 0, 0))]        # 100 % both
    c = cache_check(calls)
    assert c["simulated"] == {"read": 1900, "write": 1100, "uncached": 0, "write_1h": 0}
    assert c["recorded"] == {"read": 1800, "write": 900, "uncached": 100, "write_1h": 200}
    assert c["read_share_simulated"] == pytest.approx(100 * 1900 / 3000, abs=0.01)
    assert c["read_share_recorded"] == pytest.approx(60.0)
    assert (c["read_share_error_median"], c["read_share_error_mean"]) == (0.0, pytest.approx(10 / 3, abs=0.01))
    assert cache_check([]) == {}


def test_cache_check_on_a_real_claude_code_session(sessions_dir) -> None:
    """The recorded requests of a real session (78 calls, 5-minute and 1-hour cache writes) through the
    anthropic-style simulation read from the cache about what Anthropic billed as read."""
    from historygraph.eval.report import cache_checks
    from historygraph.traces import read_traces

    (t,) = read_traces(sessions_dir / "claude-code" / "entireio__cli__a1d04b39-c7d2-47c4-aec6-d0118b0f71c6.jsonl.gz")
    res = replay_trace(t, {"full": create("full", replay=True)}, 32_000, Signals())
    c = cache_checks([res])["claude-code (anthropic-style)"]
    assert c["calls"] == 78
    assert abs(c["read_share_simulated"] - c["read_share_recorded"]) < 2.0
    assert c["read_share_error_median"] < 1.0


def test_equal_cost_interpolates_the_budget_where_the_bill_meets_the_recorded_one() -> None:
    from historygraph.eval.sessions_view import equal_cost

    def row(policy, budget, ratio, recall):
        return {"source": "ALL", "policy": policy, "budget": budget, "bill_vs_recorded_simulated": ratio, "recall": recall}

    rows = [row(RECORDED, b, 1.0, 70.0) for b in (16000, 32000, 64000)]
    rows += [row("learned-stable", 16000, 0.6, 60.0), row("learned-stable", 32000, 0.8, 80.0), row("learned-stable", 64000, 1.2, 94.0)]
    rows += [row("prune", b, 1.5, 20.0) for b in (16000, 32000, 64000)]
    rows += [row("cheap", b, 0.5, r) for b, r in ((16000, 10.0), (32000, 20.0), (64000, 30.0))]
    got = {e.policy: e for e in equal_cost(rows)}
    # 0.8 at 32k, 1.2 at 64k: 1.0 halfway, B = 48000, recall (80 + 94) / 2 = 87
    assert (got["learned-stable"].budget, got["learned-stable"].recall, got["learned-stable"].recorded_recall) == (48000, 87.0, 70.0)
    assert (got["prune"].budget, got["prune"].side, got["prune"].recall) == (None, "above", 20.0)
    assert (got["cheap"].budget, got["cheap"].side, got["cheap"].recall) == (None, "below", 30.0)
    assert "B ≈ 48,000 tokens" in got["learned-stable"].line([16000, 32000, 64000])
    assert equal_cost([r for r in rows if r["policy"] != RECORDED]) == []


def test_the_recommendation_for_session_logs_is_against_the_agents_own_bill() -> None:
    from historygraph.eval.sessions_view import recommend_vs_own

    def row(policy, budget, ratio, recall):
        return {"source": "ALL", "policy": policy, "budget": budget, "bill_vs_recorded_simulated": ratio, "recall": recall}

    rows = [row(RECORDED, b, 1.0, 70.0) for b in (16000, 32000)] + [row("full", b, 1.3, 100.0) for b in (16000, 32000)]
    rows += [row("oracle", b, 0.5, 99.0) for b in (16000, 32000)]
    rows += [row("learned-stable", 16000, 0.9, 72.0), row("learned-stable", 32000, 1.1, 80.0)]
    rows += [row("prune", 16000, 0.95, 20.0), row("prune", 32000, 1.5, 30.0), row("cheap", 32000, 0.5, 60.0)]
    picks = {p.budget: p for p in recommend_vs_own(rows)}
    # full and the bound are never picked; at 32k one policy is cheaper but keeps less than the agent's own
    assert (picks[16000].policy, picks[16000].recall, picks[16000].ratio) == ("learned-stable", 72.0, 0.9)
    assert picks[32000].policy is None and "no policy keeps as much" in picks[32000].line()
    # the trade-off on offer then: the most recall below the agent's bill (cheap, not prune at 1.5 or the bound)
    assert picks[32000].cheaper == ("cheap", 60.0, 0.5) and picks[32000].line().endswith("to pay less, cheap keeps 60.0 % for 0.50× its bill")
    assert picks[16000].cheaper is None
    # a budget with no pick names the best pick of the others instead of saying to keep the agent's own
    assert picks[32000].better == (16000, "learned-stable", 72.0, 0.9)
    assert "keep it" not in picks[32000].line()
    assert "at this budget; at B = 16,000, learned-stable does: 72.0 % for 0.90× its bill" in picks[32000].line()


def test_a_bill_a_little_above_the_agents_own_never_reads_as_equal_to_it() -> None:
    """A one-session replay (58e50d6c, B = 32000) had learned-stable at 100 % recall, as much as the
    agent's own, for 1.004× its bill: the table showed "1.00" and the line "no policy keeps as much
    … keep it" with no word of it. Now the ratio keeps a third decimal where two would round it to
    1.00, and the line names the policy that keeps as much for more."""
    from historygraph.eval.sessions_view import project_table, ratio, recommend_vs_own

    assert [ratio(v) for v in (1.004, 0.996, 1.0, 1.0004, 0.98, 1.1, None)] == [
        "1.004", "0.996", "1.00", "1.00", "0.98", "1.10", "–"]

    def row(policy, budget, r, recall):
        return {"source": "ALL", "policy": policy, "budget": budget, "bill_vs_recorded_simulated": r, "recall": recall}

    rows = [row(RECORDED, 32000, 1.0, 100.0), row("full", 32000, 1.0, 100.0), row("learned-stable", 32000, 1.004, 100.0),
            row("contextrender", 32000, 3.9, 100.0), row("prune", 32000, 0.9, 57.1)]
    (pick,) = recommend_vs_own(rows)
    assert pick.policy is None and pick.dearer == ("learned-stable", 100.0, 1.004)
    assert pick.line() == ("B = 32,000: the agent's own context kept all it later reused (100 %), which no policy matches "
                           "for no more than its bill; learned-stable keeps 100.0 % but costs 1.004× its bill, so a "
                           "slightly smaller budget costs what it cost (each policy at the agent's own bill, below); "
                           "to pay less, prune keeps 57.1 % for 0.90× its bill")
    # a near tie (at most 1.05× the bill) is no "keep it", at its budget or the others; a dearer one is
    rows += [row(RECORDED, 16000, 1.0, 100.0), row("learned-stable", 16000, 0.8, 70.0),
             row(RECORDED, 64000, 1.0, 100.0), row("learned-stable", 64000, 1.2, 100.0)]
    low, mid, high = recommend_vs_own(rows)
    assert low.line() == ("B = 16,000: the agent's own context kept all it later reused (100 %), which no policy matches "
                          "for no more than its bill at this budget; at B = 32,000, learned-stable keeps 100.0 % for 1.004× "
                          "its bill, so a slightly smaller budget costs what it cost (each policy at the agent's own bill, "
                          "below); to pay less, learned-stable keeps 70.0 % for 0.80× its bill")
    assert mid == pick
    assert "1.20× its bill" in high.line() and "keep it" not in high.line() and "at B = 32,000" in high.line()
    rows[-1] = row("learned-stable", 64000, 1.2, 100.0)
    alone = [r for r in rows if r["budget"] == 64000]
    assert ": keep it; learned-stable keeps 100.0 % but costs 1.20× its bill" in recommend_vs_own(alone)[0].line()
    proj = [{"budget": 32000, "project": "p", "policy": RECORDED, "sessions": 1, "calls": 98, "paid_usd": 4.94,
             "recall": 100.0, "bill_vs_recorded": 0.65},
            {"budget": 32000, "project": "p", "policy": "learned-stable", "recall": 100.0, "bill_vs_recorded_simulated": 1.004}]
    assert project_table(proj, [32000], "learned-stable")[1] == [["p", "1", "98", "4.94", "100.0", "0.65", "100.0", "1.004"]]


def test_a_project_whose_check_is_far_from_1_is_named() -> None:
    """A one-session replay of a Claude Code session whose simulated bill was 0.63 of what was paid
    showed the check with no word; projects off by more than 20 % are now named under the table."""
    from historygraph.eval.sessions_view import off_checks

    rows = [{"budget": 16000, "project": p, "policy": RECORDED, "bill_vs_recorded": c}
            for p, c in (("a", 0.63), ("b", 0.85), ("c", 1.31), ("ALL", 0.7))]
    rows.append({"budget": 16000, "project": "a", "policy": "learned-stable", "bill_vs_recorded": 0.1})
    assert off_checks(rows, 16000) == [("a", 0.63), ("c", 1.31)]
    assert off_checks(rows, 32000) == []


def test_the_legend_says_which_cache_ttl_was_simulated() -> None:
    from historygraph.eval.prompt_cache import CacheTokens
    from historygraph.eval.recorded import one_hour_tokens
    from historygraph.eval.sessions_view import ttl_note

    # half the writes or more at the 1-hour TTL (uses_one_hour_cache's rule), on the summed tokens
    assert one_hour_tokens(CacheTokens(write=50, write_1h=50)) and not one_hour_tokens(CacheTokens(write=51, write_1h=50))
    assert not one_hour_tokens(CacheTokens(read=10))  # no cache writes at all (a Codex session)

    def rows(*flags):  # two rows (budgets) per session, as per_trace has
        return [{"session": f"s{k}", "cache_1h": f} for k, f in enumerate(flags) for _ in (16000, 32000)]

    assert ttl_note(rows(True)).startswith("cache TTL: the session wrote the prompt cache with the 1-hour TTL, so "
                                           "anthropic-style is simulated with 1 hour there")
    assert "the 5 minutes of its description; the others" not in ttl_note(rows(True, True))
    assert "all 2 sessions wrote" in ttl_note(rows(True, True))
    assert "2 of the 3 sessions wrote" in ttl_note(rows(True, False, True)) and \
        ttl_note(rows(True, False, True)).endswith("; the others with 5 minutes")
    assert ttl_note(rows(False, False)) == "" and ttl_note([{"session": "x"}]) == ""


def test_where_the_whole_history_fits_no_policy_is_recommended_or_priced() -> None:
    """A budget at which Full history never passes B: every policy shows everything, so the lines say
    so instead of recommending one or interpolating a budget there (the walkthrough's 11-call session)."""
    from historygraph.eval.sessions_view import equal_cost, recommend_vs_own

    def row(policy, budget, ratio, recall, peak=None):
        return {"source": "ALL", "policy": policy, "budget": budget, "bill_vs_recorded_simulated": ratio, "recall": recall,
                "max_history_tokens": peak}

    rows = [row(RECORDED, b, 1.0, 100.0) for b in (16000, 32000)]
    rows += [row("full", 16000, 1.0, 100.0, 20000), row("full", 32000, 1.0, 100.0, 20000)]
    rows += [row("learned", 16000, 0.7, 80.0), row("learned", 32000, 1.0, 100.0)]
    picks = {p.budget: p for p in recommend_vs_own(rows)}
    assert picks[32000].fits and "the whole history fits" in picks[32000].line()
    assert picks[16000].policy is None and not picks[16000].fits  # 80 % < the agent's 100 %
    (e,) = equal_cost(rows)
    assert (e.budget, e.side, e.ratio) == (None, "below", 0.7)  # only 16k counts: 32k holds everything
    # and the line names the budget its figures are from, not the largest replayed
    assert "at the largest such budget replayed, B = 16,000, it costs 0.70× the agent's own bill and keeps 80.0 %" in e.line([16000, 32000])
    rows = [r for r in rows if r["budget"] == 32000]
    (e,) = equal_cost(rows)
    assert e.side == "fits" and "fits every budget" in e.line([32000])


def test_one_budget_says_at_that_budget_not_at_every_budget_replayed() -> None:
    """The main job replays sessions at B = 32,000 alone and printed "cheaper at every budget replayed;
    at the largest, B = 32,000"."""
    from historygraph.eval.sessions_view import EqualCost

    e = EqualCost("ALL", "learned-stable", None, 76.6, 69.2, "below", 0.92, 32000)
    assert e.line([32000]) == ("learned-stable: at B = 32,000, it costs 0.92× the agent's own bill and keeps 76.6 % "
                               "(the agent's own context keeps 69.2 %)")
    # several: the edge is the largest budget the session's history passes (a walkthrough read "at the largest,
    # B = 16,000" for a run up to 64,000)
    assert e.line([16000, 32000, 64000]).startswith(
        "learned-stable: cheaper than the agent's own wherever the history passes B; at the largest such budget replayed, "
        "B = 32,000, it costs")
    d = EqualCost("ALL", "learned", None, 85.3, 69.2, "above", 3.6, 32000)
    assert d.line([32000]).startswith("learned: at B = 32,000, it costs 3.60×")


def test_a_session_s_project_is_its_git_repository_where_known(tmp_path) -> None:
    """One repository cloned in several folders is one project: the repository_url Codex records,
    else the origin remote of the folder the agent ran in when it is on this machine (a checkout,
    or a worktree whose .git file names its git directory); else the folder's last two parts."""
    from historygraph.eval.recorded import origin_url, project_of, repository_name
    from historygraph.history.events import Trace

    assert repository_name("https://github.com/EntityProcess/agentv.git") == "EntityProcess/agentv"
    assert repository_name("git@github.com:entireio/cli.git") == "entireio/cli"
    assert repository_name("ssh://git@example.com:22/team/tool/") == "team/tool"
    assert repository_name("https://example.com") == ""
    clone = tmp_path / "Repositories" / "cli"
    (clone / ".git").mkdir(parents=True)
    (clone / ".git" / "config").write_text('[core]\n\tbare = false\n[remote "upstream"]\n\turl = https://github.com/other/fork\n'
                                          '[remote "origin"]\n\turl = git@github.com:entireio/cli.git\n\tfetch = +refs/heads/*\n')
    (clone / ".git" / "worktrees" / "w1").mkdir(parents=True)
    (clone / ".git" / "worktrees" / "w1" / "commondir").write_text("../..\n")
    tree = tmp_path / "elsewhere" / "w1"
    tree.mkdir(parents=True)
    (tree / ".git").write_text(f"gitdir: {clone / '.git' / 'worktrees' / 'w1'}\n")
    bare = tmp_path / "work" / "cli"  # a checkout without an origin remote
    (bare / ".git").mkdir(parents=True)
    (bare / ".git" / "config").write_text('[remote "upstream"]\n\turl = https://github.com/other/fork\n')
    assert origin_url(str(clone)) == origin_url(str(tree)) == "git@github.com:entireio/cli.git"
    assert origin_url(str(bare)) is None and origin_url(str(tmp_path / "gone")) is None

    def session(**meta) -> Trace:
        return Trace("claude-code", "s", str(tmp_path / "p" / "s.jsonl"), [], meta={"usage": [{"input_tokens": 1}], **meta})
    assert project_of(session(cwd=str(clone))) == project_of(session(cwd=str(tree))) == "entireio/cli"
    assert project_of(session(cwd=str(bare))) == "work/cli"  # no origin: the folder, as before
    assert project_of(session(cwd="/Users/someone/Repositories/app")) == "Repositories/app"  # not on this machine
    assert project_of(session(cwd="/nowhere/x", repository="https://github.com/EntityProcess/agentv.git")) == "EntityProcess/agentv"
