"""A cache-stable policy re-selects when the provider's prompt cache has expired (issue 49 item 2):
the next request is written whole anyway, so a re-selection then costs no more than an append.
The pause is read from the messages' timestamps (the replay's recorded times; the proxy stores
each new message with the time its request arrived), the TTL from the request (Anthropic's
``"ttl": "1h"``) or, when it names none, the 5 minutes both providers document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from historygraph import ContextGraph, Message, Signals, ToolCall, check_invariants, create
from historygraph.policies.cache_stable import CacheStableConfig
from historygraph.providers.anthropic_cache import requested_ttl
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.store import SQLiteStore

import claude_code_session as cc

SIG = Signals()
C = SIG.counter
B = 1000


def _steps(n: int, pause_before: int | None = None, pause: float = 0.0) -> list[Message]:
    """A task at t = 0, then ``n`` steps 10 s apart (an assistant message calling ``cat``, its result of
    31 lines), with ``pause`` seconds more before step ``pause_before``."""
    msgs = [Message("system", "You are a shell agent.", timestamp=0.0), Message("user", "Find the bug.", timestamp=0.0)]
    t = 0.0
    for i in range(n):
        t += 10.0 + (pause if i == pause_before else 0.0)
        msgs.append(Message("assistant", f"step {i}", (ToolCall(f"c{i}", "bash", f'{{"cmd": "cat f{i}.py"}}'),), timestamp=t))
        msgs.append(Message("tool", f"def f{i}(x):\n" + "    return x + 1\n" * 30, tool_call_id=f"c{i}", timestamp=t + 1.0))
    return msgs


def _kinds(msgs: list[Message], calls: int, ttl: float | None = None, **config: Any) -> list[tuple[str, int]]:
    """(``stats["cache_stable"]``, history tokens) of ``prune-stable`` at each of ``calls`` calls at B = 1000."""
    policy = create("prune-stable", **config)
    g = ContextGraph("s", msgs[:2])
    g.cache_ttl = ttl
    out = []
    for i in range(calls):
        g.extend(msgs[2 + 2 * i: 4 + 2 * i])
        r = policy.render(g, B, SIG)
        check_invariants(r, g, C)
        out.append((r.stats["cache_stable"], r.history_tokens))
    return out


def test_a_pause_longer_than_the_ttl_reselects_and_a_shorter_one_appends():
    """Steps of 234 tokens: 4 fit in B = 1000, the fifth re-selects to 0.75·B, the sixth appends (the
    history then holds more than 750 tokens). When the sixth step's result comes 300 s after the
    fifth's (the TTL: an entry unused for more than it is dropped) it still appends; 301 s
    re-selects, to at most 750 tokens; with the request's 1-hour TTL, or expiry off, or without timestamps, it appends."""
    plain = _kinds(_steps(6), 6)
    assert [k for k, _ in plain] == ["reselected", "appended", "appended", "appended", "reselected", "appended"]
    assert plain[4][1] <= 750 < plain[5][1]
    # the previous request ended with step 4's result, this one with step 5's: 10 s + the pause later
    at_ttl = _kinds(_steps(6, 5, 290.0), 6)[5]
    assert at_ttl[0] == "appended"  # 300 s: not more than the TTL
    expired = _kinds(_steps(6, 5, 291.0), 6)[5]
    assert expired[0] == "expired" and expired[1] <= 750
    assert _kinds(_steps(6, 5, 291.0), 6, ttl=3600.0)[5][0] == "appended"
    assert _kinds(_steps(6, 5, 291.0), 6, expiry=0.0)[5][0] == "appended"
    untimed = [Message(m.role, m.content, m.tool_calls, m.tool_call_id) for m in _steps(6, 5, 291.0)]
    assert _kinds(untimed, 6)[5][0] == "appended"


def test_after_a_pause_on_the_5_minute_cache_the_old_generation_goes_on_the_hour():
    """``old_ttl``: a session whose requests ask for Anthropic's 5 minutes (``cache_ttl`` 300) pauses
    301 s before step 5 (an expiry: it re-selects) and 310 s before step 7. From the re-selection
    on, each rendering of ``learned-stable`` asks for the hour on its old generation
    (``stats["cache_old_ttl"]``), so the second pause appends; with ``old_ttl`` 0, or when the TTL
    asked for is unknown (an OpenAI client), nothing asks for the hour and the second pause
    re-selects too, as it does for ``prune-stable``, which has no generations to put on the hour."""
    msgs = _steps(8, 5, 291.0)
    late = [Message(m.role, m.content, m.tool_calls, m.tool_call_id, timestamp=m.timestamp + 300.0) for m in msgs[16:]]
    msgs = msgs[:16] + late  # 310 s between step 6's result and step 7

    def run(ttl: float | None, name: str = "learned-stable", **config: Any) -> list[tuple[str, float | None]]:
        policy = create(name, **config)
        g = ContextGraph("s", msgs[:2])
        g.cache_ttl = ttl
        out = []
        for i in range(8):
            g.extend(msgs[2 + 2 * i: 4 + 2 * i])
            r = policy.render(g, B, SIG)
            out.append((r.stats["cache_stable"], r.stats.get("cache_old_ttl")))
        return out
    kinds = run(300.0)
    assert [k for k, _ in kinds[4:]] == ["collected", "expired", "appended", "appended"]
    assert [t for _, t in kinds] == [None] * 5 + [3600.0] * 3
    for off in (run(300.0, old_ttl=0.0), run(None)):
        assert [k for k, _ in off[4:]] == ["collected", "expired", "appended", "expired"]
        assert not any(t for _, t in off)
    assert [k for k, _ in run(300.0, "prune-stable")[4:]] == ["reselected", "expired", "appended", "expired"]
    with pytest.raises(ValueError, match="old_ttl must be 3600"):
        CacheStableConfig(old_ttl=600.0)


def test_a_negative_expiry_is_refused():
    with pytest.raises(ValueError, match="expiry must be ≥ 0 seconds"):
        CacheStableConfig(expiry=-1.0)


@pytest.mark.parametrize("body, ttl", [
    ({"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}, 3600.0),
    ({"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}, 300.0),
    ({"tools": [{"name": "t", "cache_control": {"type": "ephemeral", "ttl": "1h"}}], "system": "plain"}, 3600.0),
    ({"cache_control": {"type": "ephemeral", "ttl": "5m"}, "system": [{"type": "text", "text": "x"}]}, 300.0),
    ({"system": "plain", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi",
                                                                    "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]}, None),
])
def test_the_ttl_a_request_asks_for(body, ttl):
    """The longest ``ttl`` among the breakpoints on the tools, the system blocks and the top level
    (Anthropic, "Prompt caching": 5 minutes when the breakpoint names none); message blocks are not read."""
    assert requested_ttl(body) == ttl


def _serve(tmp_path: Path, system: list[dict[str, Any]], monkeypatch, pauses: tuple[int, ...] = (45,),
           params: dict[str, dict[str, Any]] | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """The 60-call Claude Code-shaped session (tests/claude_code_session.py) through the proxy at
    B = 16k with its defaults (``params``: the policies' overrides), the proxy's clock moving 20 s
    per request and 410 s before each request of ``pauses`` (45: the 46th); the kind of rendering
    of each request, from its omission record, and each answer's usage."""
    monkeypatch.setattr(cc, "SYSTEM", system)
    up, _ = cc.provider()
    app = create_app(ServerConfig(anthropic_upstream="http://provider", store=str(tmp_path / "s.sqlite"), budget=16_000,
                                  policy_params=params or {}))
    app.state.proxy.transport = httpx.ASGITransport(app=up)
    reads = []  # the proxy reads its clock twice a request: when it stores the request and its answer

    def clock() -> float:
        reads.append(None)
        return 1.8e9 + 10.0 * len(reads) + sum(400.0 for k in pauses if len(reads) > 2 * k)
    app.state.proxy.clock = clock
    usages = cc.run([cc.asgi_client(app)], 60, {"x-api-key": "sk-ant-dummy", "anthropic-version": "2023-06-01",
                                                "X-HistoryGraph-Session": "cc"}, stream=True)
    app.state.proxy.store.close()
    store = SQLiteStore(tmp_path / "s.sqlite")
    try:
        stored = store.messages("cc")
        assert all(m.timestamp is not None and m.timestamp >= 1.8e9 for m in stored[:-1])  # the time each arrived
        return [r.get("cache_stable", "") for r in store.omitted("cc")], usages
    finally:
        store.close()


def test_the_proxy_reselects_after_a_pause_longer_than_the_requested_ttl(tmp_path, monkeypatch):
    """Claude Code marks its system blocks with the 5-minute TTL: the request 420 s after the one before is a
    re-selection after expiry, and no other is; with ``"ttl": "1h"`` marks the same pause is not."""
    kinds, _ = _serve(tmp_path / "a", cc.SYSTEM, monkeypatch)
    assert len(kinds) == 60 and [i for i, k in enumerate(kinds) if k == "expired"] == [45]
    hour = [{**b, "cache_control": {"type": "ephemeral", "ttl": "1h"}} for b in cc.SYSTEM]
    kinds, _ = _serve(tmp_path / "b", hour, monkeypatch)
    assert len(kinds) == 60 and "expired" not in kinds


def test_after_a_pause_the_proxy_keeps_the_old_generation_on_the_hour(tmp_path, monkeypatch):
    """``old_ttl`` end to end (rule 6 of providers/anthropic_cache.py), Claude Code on the 5-minute
    cache with pauses of 410 s before requests 45 and 53: no request before the first pause writes
    at the hour; the re-selection after it writes the system prompt and its old generation with
    the hour (the provider, which refuses an hour after 5 minutes, accepts all 60), so the second
    pause is not an expiry: its request extends the one before. With ``-P learned-stable.old_ttl=0``
    both pauses re-select, and the second rewrites all but the system prompt and the task (the
    fake provider keeps entries without a clock: what it reads there is only what a re-selection
    keeps)."""
    kinds, usages = _serve(tmp_path / "a", cc.SYSTEM, monkeypatch, (45, 53))
    assert len(usages) == 60
    hour = [u["cache_creation"]["ephemeral_1h_input_tokens"] for u in usages]
    assert not any(hour[:45]) and hour[45] > 0
    assert [i for i, k in enumerate(kinds) if k == "expired"] == [45]
    kept, usages_kept = _serve(tmp_path / "b", cc.SYSTEM, monkeypatch, (45, 53), {"learned-stable": {"old_ttl": 0.0}})
    assert not any(u["cache_creation"]["ephemeral_1h_input_tokens"] for u in usages_kept)
    assert [i for i, k in enumerate(kept) if k == "expired"] == [45, 53]
    assert usages[53]["cache_read_input_tokens"] > 3 * usages_kept[53]["cache_read_input_tokens"]


def _hour_session(tmp_path: Path, monkeypatch, params: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The 60-call Claude Code-shaped session through the proxy at B = 16k, every client breakpoint
    (system blocks, last two messages) with the 1-hour TTL, as Claude Code writes on such accounts;
    each answer's usage as the fake provider reports it."""
    hour = {"type": "ephemeral", "ttl": "1h"}
    monkeypatch.setattr(cc, "SYSTEM", [{**b, "cache_control": hour} for b in cc.SYSTEM])
    monkeypatch.setattr(cc, "MESSAGE_MARK", hour)
    up, _ = cc.provider()
    app = create_app(ServerConfig(anthropic_upstream="http://provider", store=str(tmp_path / "s.sqlite"), budget=16_000,
                                  policy_params=params))
    app.state.proxy.transport = httpx.ASGITransport(app=up)
    try:
        return cc.run([cc.asgi_client(app)], 60, {"x-api-key": "sk-ant-dummy", "anthropic-version": "2023-06-01",
                                                  "X-HistoryGraph-Session": "cc"}, stream=True)
    finally:
        app.state.proxy.store.close()


def test_through_the_proxy_the_young_generation_is_written_with_the_5_minute_ttl(tmp_path, monkeypatch):
    """Rule 5 of providers/anthropic_cache.py end to end: with the default (``young_ttl`` 300) the
    provider, which refuses an hour after 5 minutes, accepts all 60 requests and bills most writes at
    the 5-minute price; with ``serve -P learned-stable.young_ttl=0`` every write is at the hour's.
    The bill (writes at 1.25× or 2×, reads at 0.1×) falls."""
    short = _hour_session(tmp_path / "a", monkeypatch, {})
    kept = _hour_session(tmp_path / "b", monkeypatch, {"learned-stable": {"young_ttl": 0.0}})
    assert len(short) == len(kept) == 60

    def writes(usages: list[dict[str, Any]], kind: str) -> int:
        return sum(u["cache_creation"][f"ephemeral_{kind}_input_tokens"] for u in usages)
    assert writes(kept, "5m") == 0 and writes(kept, "1h") > 0
    assert writes(short, "5m") > 0 and writes(short, "1h") > 0  # the system prompt and the old generation keep the hour
    # the same renderings write the same tokens, only at another TTL (about half at 5 minutes here:
    # 45,028 of 91,003), so the bill falls (244.8k to 211.0k input units)
    assert writes(short, "5m") + writes(short, "1h") == writes(kept, "1h")
    assert cc.bill(short) < 0.9 * cc.bill(kept)


def test_through_the_proxy_a_reselection_on_the_hour_reads_the_head_it_keeps(tmp_path, monkeypatch):
    """``tenure`` end to end (policies/cache_stable.py, rule 4 of providers/anthropic_cache.py): Claude
    Code on the 1-hour cache, its four breakpoints leaving the proxy none. The provider, which
    refuses a fifth breakpoint, accepts all 60 requests; some re-selections keep the previous one's
    head, forward it as it was sent (client breakpoints aside), and read it from the cache: more
    than the re-selections that keep none, which read the system prompt alone. With
    ``-P learned-stable.tenure=0`` no re-selection keeps one."""
    import json

    import claude_code_session as cc_session
    from test_proxy_stable import unmarked

    seen: list[dict[str, Any]] = []
    provider = cc_session.provider

    def recording() -> tuple[Any, list[dict[str, Any]]]:
        app, bodies = provider()
        seen.append(bodies)  # type: ignore[arg-type]
        return app, bodies
    monkeypatch.setattr(cc_session, "provider", recording)

    def records(store: Path) -> list[dict[str, Any]]:
        s = SQLiteStore(store)
        try:
            return s.omitted("cc")
        finally:
            s.close()
    usages = _hour_session(tmp_path / "a", monkeypatch, {})
    recs, bodies = records(tmp_path / "a" / "s.sqlite"), seen[-1]
    assert len(usages) == len(bodies) == len(recs) == 60
    kept = [i for i, r in enumerate(recs) if "kept_head" in r]
    whole = [i for i, r in enumerate(recs) if r.get("cache_stable") == "reselected" and "kept_head" not in r and i]
    assert kept and whole, [r.get("cache_stable") for r in recs]
    read = [u["cache_read_input_tokens"] for u in usages]
    assert min(read[i] for i in kept) > max(read[i] for i in whole)
    def leading(i: int) -> int:  # turns request i forwards as request i - 1 did, client breakpoints aside
        now, before = unmarked(bodies[i]["messages"]), unmarked(bodies[i - 1]["messages"])
        return next((k for k, (a, b) in enumerate(zip(now, before)) if json.dumps(a) != json.dumps(b)), min(len(now), len(before)))
    assert min(leading(i) for i in kept) > max(leading(i) for i in whole) >= 1, ([leading(i) for i in kept], [leading(i) for i in whole])
    off = _hour_session(tmp_path / "b", monkeypatch, {"learned-stable": {"tenure": 0.0}})
    assert len(off) == 60 and not any("kept_head" in r for r in records(tmp_path / "b" / "s.sqlite"))
