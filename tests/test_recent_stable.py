"""The cache-stable default keeps the agent's newest steps in view (invariant 10, docs/architecture.md):
``Selection.revive_recent``'s ``total`` and ``brief`` checked by hand, and the default on a real
Claude Code session."""

from __future__ import annotations

import pytest

from historygraph.eval.recent import _shown
from historygraph.eval.replay import replay_trace
from historygraph.history.graph import ContextGraph
from historygraph.policies import PolicyError, Signals, create
from historygraph.policies.cache_stable import CacheStableConfig
from historygraph.render import Layout, check_invariants
from historygraph.signals.tokens import TokenCounter

from tests.test_recent_calls import steps

NEWEST = [11, 13, 15, 17, 19]  # steps(10): the five newest assistant messages


def whole_and_cost(total: int | None, brief: bool) -> tuple[int, int, int]:
    """On ``steps(10)`` at B = 1500 (all but the latest step dropped): what ``revive_recent(5, total=…,
    brief=…)`` returns, how many of the five newest the assembled rendering shows with their text
    and calls as stored, and the tokens the revival added."""
    counter = TokenCounter()
    g = ContextGraph("recent", steps(10))
    lay = Layout(g, counter, 1500, result_reserve=0.95, brief_revivals=True)
    sel = lay.selection()
    before = sel.used
    n = sel.revive_recent(5, total=total, brief=brief)
    r = lay.assemble("t", sel)
    check_invariants(r, g, counter)
    at = {p: m for m, p in zip(r.messages, r.positions) if p is not None}
    return n, _shown(NEWEST, g.messages, at), sel.used - before


def test_brief_false_shows_the_newest_steps_text_as_stored() -> None:
    assert whole_and_cost(None, brief=True)[:2] == (5, 1)  # brief view: calls as stored, text a marker
    n, whole, added = whole_and_cost(None, brief=False)
    assert (n, whole) == (5, 5)
    # each of the four revived steps carries 8 sentences of text: more than in brief view
    assert added > whole_and_cost(None, brief=True)[2]


def test_total_caps_what_the_newest_steps_add_together() -> None:
    _, _, added = whole_and_cost(None, brief=False)
    assert whole_and_cost(added, brief=False)[:2] == (5, 5)  # exactly enough
    # one token short: the oldest of the five (tried last) stays in its marker
    assert whole_and_cost(added - 1, brief=False)[:2] == (4, 4)
    # nothing to spend: only the latest step, which is never dropped, is shown
    assert whole_and_cost(0, brief=False)[:2] == (1, 1)


def test_the_wrapper_gives_learned_the_newest_steps_and_leaves_the_original_alone() -> None:
    base = create("learned")
    policy = create("learned-stable")
    cfg = policy.base.config
    assert (cfg.recent_calls, cfg.recent_step_share, cfg.recent_share, cfg.recent_brief) == (5, 1.0, 0.075, False)
    assert (CacheStableConfig().recent, CacheStableConfig().recent_share) == (5, 0.075)
    assert (base.config.recent_calls, base.config.recent_brief) == (0, True)  # plain learned unchanged
    off = create("learned-stable", recent=0)
    assert off.base.config.recent_calls == 0
    moved = base.with_recent(3, 0.2)
    assert moved.model is base.model and base.config.recent_calls == 0 and moved.config.recent_calls == 3
    for bad in ({"recent": -1}, {"recent_share": 1.5}):
        with pytest.raises(PolicyError, match="recent"):
            create("learned-stable", **bad)


def test_the_default_shows_the_five_newest_steps_at_every_call_of_a_real_session(sessions_dir) -> None:
    """entireio__cli__c010174c (Claude Code, 93 assistant messages; 88 calls with 5 before them) at
    B = 16000: the default shows all five newest whole at each of the 88 (64 with ``recent=0``),
    every invariant holding, and keeps 77 of the 80 reuses shown without it."""
    from historygraph.traces import read_traces

    (t,) = read_traces(sessions_dir / "claude-code" / "entireio__cli__c010174c-a7cd-4bcc-b7d4-61258d6c463f.jsonl.gz")
    res = replay_trace(t, {"d": create("learned-stable", replay=True),
                           "z": create("learned-stable", replay=True, recent=0)}, 16000, Signals())
    d, z = res.stats["d"], res.stats["z"]
    assert not d.violations and not z.violations
    assert (len(d.recent.shown[5]), d.recent.shown[5].count(5)) == (88, 88)
    assert z.recent.shown[5].count(5) == 64
    assert (d.hits, z.hits) == (77, 80)
