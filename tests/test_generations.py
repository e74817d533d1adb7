"""Generational cache-stable rendering (issue 49 item 2): a minor collection replaces only young
results (appended since the last collection) by placeholders, least probable first, so the old
generation stays a byte-identical prefix; the simulated Anthropic cache and the proxy put a
breakpoint at each generation's end, at most 4 in all."""

from __future__ import annotations

import json

import pytest

from historygraph import ContextGraph, Message, Signals, ToolCall, check_invariants, create
from historygraph.eval.prices import load_price_models
from historygraph.eval.prompt_cache import CacheTokens, PromptCache
from historygraph.policies import stable_state
from historygraph.policies.cache_stable import CacheStable, CacheStableConfig
from historygraph.providers.anthropic import Piece, boundary_block, from_canonical
from historygraph.providers.anthropic_cache import breakpoints, place_breakpoints
from historygraph.render.markers import placeholder_for
from historygraph.traces import read_traces

from doubles import RankedPrune

SIG = Signals()
C = SIG.counter
B = 1000


def _steps(n: int) -> list[Message]:
    """A task, then ``n`` steps: an assistant message calling ``cat`` and its result (31 lines)."""
    msgs = [Message("system", "You are a shell agent."), Message("user", "Find the bug.")]
    for i in range(n):
        msgs.append(Message("assistant", f"step {i}", (ToolCall(f"c{i}", "bash", f'{{"cmd": "cat f{i}.py"}}'),)))
        msgs.append(Message("tool", f"def f{i}(x):\n" + "    return x + 1\n" * 30, tool_call_id=f"c{i}"))
    return msgs


def _run(policy, calls: int, ttl: float | None = None) -> tuple[list, list[Message]]:
    """``calls`` calls of :func:`_steps` rendered at B with every invariant checked; ``ttl``: the
    prompt-cache TTL the session's requests ask for (``graph.cache_ttl``)."""
    msgs = _steps(calls)
    g = ContextGraph("s", msgs[:2])
    g.cache_ttl = ttl
    out = []
    for i in range(calls):
        g.extend(msgs[2 + 2 * i: 4 + 2 * i])
        r = policy.render(g, B, SIG)
        check_invariants(r, g, C)
        assert r.history_tokens <= B
        out.append(r)
    return out, msgs


def test_sizes_the_hand_computations_use():
    msgs = _steps(2)
    step = C.count_message(msgs[2]) + C.count_message(msgs[3])
    saved = C.count_message(msgs[3]) - C.count_message(placeholder_for(msgs[3], C))
    assert (step, saved) == (234, 190)


def test_a_minor_collection_replaces_the_oldest_young_results_until_the_young_share_holds():
    """prune with every reuse probability 0 (so the oldest first), young = 0.9, B = 1000, steps of 234 tokens of
    which a placeholder saves 190: the history fits up to 4 steps (936); the fifth (1,170) passes
    B, and instead of a re-selection the two oldest results become placeholders: one would leave
    980 > 900, two leave 790. The opening and the first call stay as sent (the old generation), and the next calls
    collect again, each keeping the previous collection's messages byte for byte."""
    policy = CacheStable("p", CacheStableConfig(young=0.9, recall_tail=False, predicted_tail=0), base=RankedPrune({}))
    rs, msgs = _run(policy, 7)
    kinds = [r.stats["cache_stable"] for r in rs]
    assert kinds == ["reselected", "appended", "appended", "appended", "collected", "collected", "collected"]
    r, prev = rs[4], rs[3]
    assert prev.history_tokens == 936 and r.history_tokens == 936 + 234 - 2 * 190 == 790
    assert [p for m, p in zip(r.messages, r.positions) if m.rendered_as == "placeholder"] == [3, 5]
    assert set(r.full) == {7, 9, 11} and r.messages[:2] == prev.messages[:2]
    # the old generation read (the opening and the first call), the new one written (after the latest call)
    assert r.stats["cache_boundaries"] == [3, 11]
    assert r.reasons[3].startswith("placeholder: collected from the young generation")
    # the next call: the fifth step's result (9, no longer the newest) goes; the first 11 messages stay
    nxt = rs[5]
    assert nxt.messages[:11] == r.messages[:11] and nxt.stats["cache_boundaries"] == [11, 13]
    assert [p for m, p in zip(nxt.messages, nxt.positions) if m.rendered_as == "placeholder"] == [3, 5, 11]
    assert nxt.history_tokens == 790 + 234 - 190


def test_the_least_probable_young_results_go_first():
    """The same run, with reuse probabilities 3: 0.9, 5: 0.01, 7: 0.5, 9: 0.02: the fifth call
    collects 5 and then 9 (the two least probable), keeping 3 and 7 complete."""
    policy = CacheStable("p", CacheStableConfig(young=0.9, recall_tail=False, predicted_tail=0.0),
                         base=RankedPrune({3: 0.9, 5: 0.01, 7: 0.5, 9: 0.02}))
    rs, _ = _run(policy, 5)
    r = rs[4]
    assert r.stats["cache_stable"] == "collected" and r.history_tokens == 790
    assert [p for m, p in zip(r.messages, r.positions) if m.rendered_as == "placeholder"] == [5, 9]
    assert set(r.full) == {3, 7, 11}


def test_without_a_young_share_or_when_it_cannot_hold_it_re_selects():
    """young = 0 (off) re-selects where the run above collects, and so does a wrapped policy
    without reuse probabilities (prune itself); young = 0.3 (300 tokens) cannot be reached by
    collecting the young results alone (the opening and the newest step are 240+), so it
    re-selects too."""
    for off in (CacheStable("p", CacheStableConfig(young=0.0, recall_tail=False, predicted_tail=0), base=RankedPrune({})),
                CacheStable("p", CacheStableConfig(young=0.9, recall_tail=False, predicted_tail=0), base=create("prune"))):
        r = _run(off, 5)[0][4]
        assert r.stats["cache_stable"] == "reselected" and "cache_boundaries" not in r.stats
    small = CacheStable("p", CacheStableConfig(young=0.3, recall_tail=False, predicted_tail=0), base=RankedPrune({}))
    assert _run(small, 5)[0][4].stats["cache_stable"] == "reselected"
    with pytest.raises(ValueError, match="young must be in"):
        CacheStableConfig(young=1.5)


def test_the_generation_boundary_survives_the_store(tmp_path):
    """The state text keeps the boundary; a second policy object reading it (another process)
    collects exactly as the first would have."""
    from historygraph.store import open_store

    store = open_store(str(tmp_path / "s.sqlite"))
    msgs = _steps(6)
    cfg = CacheStableConfig(young=0.9, recall_tail=False, predicted_tail=0)
    one = CacheStable("prune-stable", cfg, base=RankedPrune({}))
    store.create_session("s")
    store.append("s", msgs[:2])
    for i in range(4):
        store.append("s", msgs[2 + 2 * i: 4 + 2 * i])
        one.render(store.graph("s"), B, SIG)
    text = store.policy_state("s", stable_state.key("prune-stable"))
    assert json.loads(text)["boundary"] == 3
    store.append("s", msgs[10:12])
    two = CacheStable("prune-stable", cfg, base=RankedPrune({}))  # another process: its memo empty
    g = store.graph("s")
    state = stable_state.decode(text, g)
    assert state is not None and state["boundary"] == 3 and state["paused"] is False
    paused = stable_state.decode(stable_state.encode({**state, "paused": True, "tenure": 2}, g), g)  # old_ttl's switch
    assert paused is not None and paused["paused"] is True and paused["tenure"] == 2  # and the head tenure keeps
    assert state["tenure"] == 0  # no re-selection marked one (the graph asks for no hour)
    r = two.render(g, B, SIG)
    assert r.stats["cache_stable"] == "collected" and r.stats["cache_boundaries"] == [3, 11]


def _words(n: int) -> str:
    return "x" + " x" * (n - 1)


def test_the_simulated_anthropic_cache_reads_up_to_the_old_generation_at_a_collection():
    """Messages of 1,000 / 100 / 200 / 300 / 100 / 100 tokens (content + 3). Request 1 is the whole
    history; request 2 replaced its fifth message's successor (T2) by a shorter form and appended a
    step. Without a generation breakpoint the only entry request 2 shares is the opening's
    (1,100 tokens); with one after T1 in request 1, request 2 reads 1,600."""
    S, U = Message("system", _words(997)), Message("user", _words(97))
    A1, T1 = Message("assistant", _words(197)), Message("tool", _words(297), tool_call_id="a")
    A2, T2 = Message("assistant", _words(97)), Message("tool", _words(97), tool_call_id="b")
    T2p, A3, T3 = Message("tool", _words(7), tool_call_id="b"), Message("assistant", _words(47)), Message("tool", _words(47), tool_call_id="c")
    first, second = [S, U, A1, T1, A2, T2], [S, U, A1, T1, A2, T2p, A3, T3]
    assert (C.count_messages(first), C.count_messages(second)) == (1800, 1810)
    model = load_price_models()["anthropic-style"]
    for marks, read in (((), 1100), ((4,), 1600)):
        cache = PromptCache(model, C)
        cache.observe(first, 1800, boundaries=marks)
        assert cache.observe(second, 1810, boundaries=(4, 6) if marks else ()) == CacheTokens(read=read, write=1810 - read)


def _three_requests() -> tuple[list[Message], list[Message], list[Message]]:
    """A system prompt and task (1,100 tokens), a step of 500 (the old generation ends after it, at
    message 4), a step of 200; then one step of 100 appended at each request: 1,800 / 1,900 / 2,000."""
    S, U = Message("system", _words(997)), Message("user", _words(97))
    A1, T1 = Message("assistant", _words(197)), Message("tool", _words(297), tool_call_id="a")
    A2, T2 = Message("assistant", _words(97)), Message("tool", _words(97), tool_call_id="b")
    A3, T3 = Message("assistant", _words(47)), Message("tool", _words(47), tool_call_id="c")
    A4, T4 = Message("assistant", _words(47)), Message("tool", _words(47), tool_call_id="d")
    return [S, U, A1, T1, A2, T2], [S, U, A1, T1, A2, T2, A3, T3], [S, U, A1, T1, A2, T2, A3, T3, A4, T4]


def test_a_young_generation_with_the_5_minute_ttl_under_a_1_hour_cache():
    """``young_ttl`` (the cache-stable default's 300 s) in the simulation of a session that writes with
    the hour: what follows the old generation's end (after T1, 1,600 tokens) is written at the
    5-minute price and lives 5 minutes; what precedes it the hour. Request 2 (60 s later, a step
    appended) reads all of request 1; request 3, after a 10-minute pause, finds the young entries
    gone and reads only the old generation, rewriting the rest at the 5-minute price. With the
    hour everywhere, request 3 would read all of request 2 and write 100 tokens at 2×."""
    one, two, three = _three_requests()
    assert [C.count_messages(m) for m in (one, two, three)] == [1800, 1900, 2000]
    model = load_price_models()["anthropic-style"]
    young = PromptCache(model, C, one_hour=True)
    assert young.observe(one, 1800, 0.0, (4,), 300.0) == CacheTokens(write_1h=1600, write=200)
    assert young.observe(two, 1900, 60.0, (4,), 300.0) == CacheTokens(read=1800, write=100)
    assert young.observe(three, 2000, 660.0, (4,), 300.0) == CacheTokens(read=1600, write=400)
    hour = PromptCache(model, C, one_hour=True)
    assert hour.observe(one, 1800, 0.0, (4,)) == CacheTokens(write_1h=1800)
    assert hour.observe(two, 1900, 60.0, (4,)) == CacheTokens(read=1800, write_1h=100)
    assert hour.observe(three, 2000, 660.0, (4,)) == CacheTokens(read=1900, write_1h=100)
    # a session on the 5-minute cache is unchanged by it
    five = PromptCache(model, C)
    assert five.observe(one, 1800, 0.0, (4,), 300.0) == CacheTokens(write=1800)


def test_an_old_generation_on_the_hour_under_a_5_minute_cache():
    """``old_ttl`` (the cache-stable default's 3600 s once the session has paused) in the simulation
    of a session on the 5-minute cache: what precedes the old generation's end (after T1, 1,600
    tokens) is written at the hour's price (2×) and lives an hour, the young generation at 5
    minutes. After a 10-minute pause request 3 still reads the old generation (1,600) and rewrites
    400 tokens at 1.25×; on the 5-minute cache alone it reads nothing and rewrites all 2,000.
    Bills in input units: 1600·2 + 200·1.25 + 1800·0.1 + 100·1.25 + 1600·0.1 + 400·1.25 = 4,415
    against 1800·1.25 + 1800·0.1 + 100·1.25 + 2000·1.25 = 5,055."""
    one, two, three = _three_requests()
    model = load_price_models()["anthropic-style"]
    hour = PromptCache(model, C)
    bills = [hour.observe(one, 1800, 0.0, (4,), 300.0, 3600.0), hour.observe(two, 1900, 60.0, (4,), 300.0, 3600.0),
             hour.observe(three, 2000, 660.0, (4,), 300.0, 3600.0)]
    assert bills == [CacheTokens(write_1h=1600, write=200), CacheTokens(read=1800, write=100), CacheTokens(read=1600, write=400)]
    five = PromptCache(model, C)
    plain = [five.observe(one, 1800, 0.0, (4,), 300.0), five.observe(two, 1900, 60.0, (4,), 300.0),
             five.observe(three, 2000, 660.0, (4,), 300.0)]
    assert plain == [CacheTokens(write=1800), CacheTokens(read=1800, write=100), CacheTokens(write=2000)]

    def units(t: CacheTokens) -> float:
        return 2.0 * t.write_1h + 1.25 * t.write + 0.1 * t.read
    assert round(sum(map(units, bills))) == 4415 and round(sum(map(units, plain))) == 5055
    # under a session already on the hour old_ttl changes nothing
    assert PromptCache(model, C, one_hour=True).observe(one, 1800, 0.0, (4,), 300.0, 3600.0) \
        == CacheTokens(write_1h=1600, write=200)


def test_at_most_four_breakpoints_the_opening_then_the_new_generation_dropped_first():
    """The simulation's points and the proxy's marks: last, system, old end, new end, opening, cut
    to 4: the opening goes first; with a client breakpoint on the system prompt, the new end too."""
    msgs = [Message("user", f"task {i}") if i == 0 else Message("assistant", f"a{i}") for i in range(8)]
    pieces: list[Piece | None] = [None] * len(msgs)
    places: list = [None] * len(msgs)
    wire = from_canonical(msgs, pieces, None, places)
    ends = [boundary_block(places, 3), boundary_block(places, 5)]
    assert ends == [(2, 0), (4, 0)]
    body = {"model": "m", "system": [{"type": "text", "text": "sys"}], "messages": wire}
    out = breakpoints(place_breakpoints(body, ends))
    assert out == [(1, 0, 0), (2, 2, 0), (2, 4, 0), (2, 7, 0)]
    client = {**body, "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]}
    assert breakpoints(place_breakpoints(client, ends)) == [(1, 0, 0), (2, 2, 0), (2, 4, 0), (2, 7, 0)]
    client2 = {**client, "tools": [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]}
    assert breakpoints(place_breakpoints(client2, ends)) == [(0, 0, 0), (1, 0, 0), (2, 2, 0), (2, 7, 0)]


def test_a_collection_moves_a_claude_code_mark_to_the_old_generations_end():
    """Claude Code's four marks (two system blocks, the last two messages) leave no room for ours.
    At a minor collection (rule 4) the old generation's end must be read: with the client's marks
    on turns 6 and 7 and the generations ending at turns 2 and 6, no client mark lies inside the
    rewritten part but the new end's and the last, so the first system block's goes (its prefix is
    inside the one read at turn 2); a mark on turn 4 (rewritten) would go instead; at an append
    nothing moves."""
    cc = {"type": "ephemeral"}
    wire = [{"role": "user" if k % 2 == 0 else "assistant", "content": [{"type": "text", "text": f"turn {k}"}]}
            for k in range(8)]
    marked = [dict(t, content=[{**t["content"][0], "cache_control": cc}]) if k in (6, 7) else t for k, t in enumerate(wire)]
    system = [{"type": "text", "text": "s1", "cache_control": cc}, {"type": "text", "text": "s2", "cache_control": cc}]
    body = {"model": "m", "system": system, "messages": marked}
    client = [(1, 0, 0), (1, 1, 0), (2, 6, 0), (2, 7, 0)]
    assert breakpoints(place_breakpoints(body, [(2, 0), (6, 0)])) == client  # no room, not a collection
    assert breakpoints(place_breakpoints(body, [(2, 0), (6, 0)], collected=True)) == [(1, 1, 0), (2, 2, 0), (2, 6, 0), (2, 7, 0)]
    stale = {**body, "messages": [dict(t, content=[{**t["content"][0], "cache_control": cc}]) if k in (4, 7) else t
                                  for k, t in enumerate(wire)]}
    assert breakpoints(place_breakpoints(stale, [(2, 0), (6, 0)], collected=True)) == [(1, 0, 0), (1, 1, 0), (2, 2, 0), (2, 7, 0)]


def test_a_tool_results_generation_end_is_its_own_block_in_the_shared_turn():
    """Two results of one assistant message travel in one user turn; a generation ending after
    the first puts the breakpoint on the first tool_result block, not on the turn's last."""
    msgs = [Message("user", "task"),
            Message("assistant", "", (ToolCall("a", "bash", "{}"), ToolCall("b", "bash", "{}"))),
            Message("tool", "one", tool_call_id="a"), Message("tool", "two", tool_call_id="b"),
            Message("assistant", "done")]
    pieces: list[Piece | None] = [None] * len(msgs)
    places: list = [None] * len(msgs)
    wire = from_canonical(msgs, pieces, None, places)
    assert [t["role"] for t in wire] == ["user", "assistant", "user", "assistant"]
    assert boundary_block(places, 3) == (2, 0) and boundary_block(places, 4) == (2, 1)
    marked = place_breakpoints({"model": "m", "messages": wire}, [(2, 0)])
    assert (2, 2, 0) in breakpoints(marked) and (2, 2, 1) not in breakpoints(marked)


def test_a_real_claude_code_session_collects_young_results_with_every_invariant_holding(sessions_dir):
    """learned-stable with young = 0.85 on a real Claude Code session at B = 16000: every rendering
    holds the invariants and B, some calls collect, and each collection starts with the previous
    request's old generation byte for byte."""
    path = sorted((sessions_dir / "claude-code").glob("*.jsonl.gz"))[2]
    trace = next(iter(read_traces(path)))
    policy = create("learned-stable", young=0.85)
    g = ContextGraph("s")
    prev, kinds = None, []
    for m in trace.messages:
        if m.role == "assistant" and len(g):
            r = policy.render(g, 16000, SIG)
            check_invariants(r, g, C)
            assert r.history_tokens <= 16000
            kinds.append(r.stats["cache_stable"])
            if kinds[-1] == "collected":
                old = r.stats["cache_boundaries"][0]
                assert r.messages[:old] == prev.messages[:old]
            prev = r
        g.append(m)
    assert kinds.count("collected") >= 3, kinds


def test_the_default_asks_for_the_5_minute_ttl_on_its_young_generation_only_when_it_has_one() -> None:
    assert CacheStableConfig().young_ttl == 300.0
    with pytest.raises(ValueError, match="young_ttl"):
        CacheStableConfig(young_ttl=60.0)
    g = ContextGraph("y")
    g.append(Message("user", _words(50)))
    for i in range(40):  # a history well over B: re-selections, collections and appends
        g.append(Message("assistant", _words(20), (ToolCall(f"c{i}", "bash", "{}"),)))
        g.append(Message("tool", _words(150), tool_call_id=f"c{i}"))
    for cfg, want in ((CacheStableConfig(), 300.0), (CacheStableConfig(young_ttl=0.0), None)):
        policy = CacheStable(config=cfg, base=create("learned"))
        graph = ContextGraph("y2")
        seen = set()
        for m in g.messages:
            graph.append(m)
            if m.role == "tool":
                r = policy.render(graph, 2000, SIG)
                if r.stats.get("cache_boundaries"):
                    seen.add(r.stats.get("cache_young_ttl"))
        assert seen == {want}



def test_a_reselection_says_the_low_mark_it_rendered_to() -> None:
    """``render`` showed "62 of the 24000 tokens" at B = 32000 with no word of where 24000 came from:
    a re-selection records its low mark (0.75·B), and the CLI's title names it."""
    g = ContextGraph("low")
    g.append(Message("user", _words(50)))
    for i in range(30):
        g.append(Message("assistant", _words(20), (ToolCall(f"c{i}", "bash", "{}"),)))
        g.append(Message("tool", _words(150), tool_call_id=f"c{i}"))
    r = create("learned-stable").render(g, 2000, SIG)
    assert r.stats["cache_stable"] == "reselected" and r.stats["rendered_to"] == 1500 and r.history_tokens <= 1500
    small = ContextGraph("fits", g.messages[:3])
    assert "rendered_to" not in create("learned-stable").render(small, 2000, SIG).stats  # it fits: unchanged, at B


def _tenure_run(ttl: float | None) -> list:
    """prune (reuse probabilities 0) under cache-stable rendering with young = 0.9, B = 1000, steps of
    234 tokens, on a session whose requests ask for the 1-hour cache (``ttl``) or the provider's default."""
    policy = CacheStable("p", CacheStableConfig(young=0.9, recall_tail=False, predicted_tail=0.0), base=RankedPrune({}))
    return _run(policy, 12, ttl)[0]


def test_a_reselection_on_the_hour_keeps_the_previous_ones_head():
    """Calls 0–6 as in the collection test above (re-selection, three appends, three collections);
    call 7 re-selects (748 input tokens: system 9, task 7, steps 0–5 each a 16-token call and a
    28-token placeholder, steps 6–7 complete at 16 + 218), and its tenure point is the first step
    boundary where the leading messages hold 0.3 of them (224.4): message 12 (16 + 5 × 44 = 236;
    before step 4 only 192), where it carries a breakpoint that writes the head (``cache_boundaries``
    [12, 17]). Call 11 re-selects again: on the hour its first 12 messages are call 7's byte for
    byte, read at the same breakpoint ([12, 25]); on the provider's default cache (no hour) both
    re-select whole ([17], [25])."""
    hour, default = _tenure_run(3600.0), _tenure_run(None)
    assert [r.stats["cache_stable"] for r in hour] == [r.stats["cache_stable"] for r in default] == (
        ["reselected"] + ["appended"] * 3 + ["collected"] * 3 + ["reselected", "appended", "collected", "collected", "reselected"])
    assert hour[11].stats["kept_head"] == 12 and hour[11].stats["cache_boundaries"] == [12, 25]
    assert hour[11].messages[:12] == hour[7].messages[:12]
    assert hour[7].stats["tenure"] == 12 and hour[7].stats["cache_boundaries"] == [12, 17]
    assert "kept_head" not in hour[7].stats  # the first re-selection on the hour had no head to keep
    assert [default[k].stats["cache_boundaries"] for k in (7, 11)] == [[17], [25]]
    assert not {"kept_head", "tenure"} & {*default[7].stats, *default[11].stats}
    with pytest.raises(ValueError, match="tenure must be in"):
        CacheStableConfig(tenure=1.0)


def test_a_real_claude_code_session_on_the_hour_keeps_heads_with_every_invariant_holding(sessions_dir):
    """The default on a real Claude Code session at B = 16000 with its requests on the 1-hour cache:
    every rendering holds the invariants and B, some re-selections keep the previous one's head,
    and each kept head is the previous request's first messages byte for byte (its breakpoint
    the first boundary)."""
    path = sorted((sessions_dir / "claude-code").glob("*.jsonl.gz"))[2]
    trace = next(iter(read_traces(path)))
    policy = create("learned-stable")
    g = ContextGraph("s")
    g.cache_ttl = 3600.0
    prev, kept = None, 0
    for m in trace.messages:
        if m.role == "assistant" and len(g):
            r = policy.render(g, 16000, SIG)
            check_invariants(r, g, C)
            assert r.history_tokens <= 16000
            if (head := r.stats.get("kept_head")) is not None:
                kept += 1
                assert r.messages[:head] == prev.messages[:head] and r.stats["cache_boundaries"][0] == head
            prev = r
        g.append(m)
    assert kept >= 2, kept
